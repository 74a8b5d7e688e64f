"""Plots of load runs (matplotlib, Agg backend): one run's latencies, and runs side by side."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(requests: list[dict], title: str, path: str | Path, params: str = "",
             summary: dict | None = None) -> Path:
    """TTFT CDF, E2E over time, and the per-request cached share of one run; p50/p99 marked,
    the run's parameters under the title."""
    plt = _plt()
    ok = [r for r in requests if r["ok"]]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    ttft = sorted(1000 * r["ttft_s"] for r in ok if r["ttft_s"] is not None)
    if ttft:
        axes[0].plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))])
    _mark_percentiles(axes[0], (summary or {}).get("ttft_s"), vertical=True)
    _mark_percentiles(axes[1], (summary or {}).get("e2e_s"), vertical=False)
    axes[0].set_xlabel("TTFT (ms)")
    axes[0].set_ylabel("fraction of requests")
    axes[0].set_title("TTFT CDF")
    axes[1].scatter([r["start_s"] for r in ok], [1000 * r["e2e_s"] for r in ok], s=6)
    bad = [r for r in requests if not r["ok"]]
    if bad:
        axes[1].scatter([r["start_s"] for r in bad], [0] * len(bad), s=10, c="red", marker="x", label="error")
        axes[1].legend(fontsize=8)
    axes[1].set_xlabel("send time (s)")
    axes[1].set_ylabel("end-to-end latency (ms)")
    axes[1].set_title("Latency over the run")
    share = [r["cached_tokens"] / r["prompt_tokens"] for r in ok if r["prompt_tokens"]]
    axes[2].hist(share, bins=20, range=(0, 1))
    axes[2].set_xlabel("cached share of the prompt")
    axes[2].set_title("Prefix cache hits per request")
    fig.suptitle(title + (f"\n{params}" if params else ""), fontsize=9)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.15, top=0.8, wspace=0.3)
    return _save(fig, plt, path)


def _mark_percentiles(ax, stats: dict | None, vertical: bool) -> None:
    """Dashed p50 and p99 lines (ms) with their values in the legend."""
    for q, style in (("p50", "--"), ("p99", ":")):
        value = (stats or {}).get(q)
        if value is None:
            continue
        line = ax.axvline if vertical else ax.axhline
        line(1000 * value, linestyle=style, color="tab:red" if q == "p99" else "tab:green",
             label=f"{q} {1000 * value:.0f} ms")
    if stats and stats.get("p50") is not None:
        ax.legend(fontsize=8)


def plot_compare(summaries: dict[str, dict], title: str, path: str | Path, params: str = "") -> Path:
    """Cached-token share and TTFT p50/p99 for several labelled runs (e.g. policies)."""
    plt = _plt()
    labels = list(summaries)
    fig, (ax_hit, ax_ttft) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_hit.bar(labels, [100 * summaries[k]["cached_token_share"] for k in labels], color="tab:blue")
    ax_hit.set_ylabel("cached prompt tokens (%)")
    ax_hit.set_title("Prefix cache hit rate")
    x = list(range(len(labels)))
    w = 0.38

    def ms(k, q):
        v = summaries[k]["ttft_s"][q]
        return 0.0 if v is None else 1000 * v

    ax_ttft.bar([i - w / 2 for i in x], [ms(k, "p50") for k in labels], w, label="p50")
    ax_ttft.bar([i + w / 2 for i in x], [ms(k, "p99") for k in labels], w, label="p99")
    ax_ttft.set_xticks(x, labels)
    ax_ttft.set_ylabel("TTFT (ms)")
    ax_ttft.set_title("Time to first token")
    ax_ttft.legend(fontsize=8)
    fig.suptitle(title + (f"\n{params}" if params else ""), fontsize=9)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.16, top=0.8, wspace=0.3)
    return _save(fig, plt, path)


def _save(fig, plt, path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
