"""Plots of a simulation report: hit rate (against both ceilings), TTFT and, when the single
pool was simulated, where each policy's gap to it went (cluster/measure/sim/report.py); and, where KV moves
between replicas, the runs side by side (``plot_kv_transfer``)."""

from __future__ import annotations

from pathlib import Path


def plot_report(report: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["policies"])
    pol = report["policies"]
    gaps = [pol[n].get("gap_to_single_pool") for n in names]
    with_gap = all(gaps)
    fig, axes = plt.subplots(1, 3 if with_gap else 2, figsize=(16 if with_gap else 11, 4.2))
    ax_hit, ax_ttft = axes[0], axes[1]
    ax_hit.bar(names, [100 * pol[n]["hit_rate"] for n in names], color="tab:blue")
    ceil = report.get("ceilings", {})
    for key, style, label in (("infinite_cache_hit_rate", ":", "infinite cache"),
                              ("single_pool_hit_rate", "--", "single pool, same capacity")):
        if key in ceil:
            ax_hit.axhline(100 * ceil[key], linestyle=style, color="k", label=label)
    ax_hit.set_ylabel("prefix hit rate (% of prompt tokens)")
    ax_hit.set_title("Prefix cache hit rate")
    if ceil:
        ax_hit.legend(loc="lower right", fontsize=8)
    x = range(len(names))
    width = 0.38
    ax_ttft.bar([i - width / 2 for i in x], [pol[n]["ttft_s"]["p50"] for n in names], width, label="p50")
    ax_ttft.bar([i + width / 2 for i in x], [pol[n]["ttft_s"]["p99"] for n in names], width, label="p99")
    ax_ttft.set_xticks(list(x), names)
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT (s, log scale)")
    ax_ttft.set_title("Time to first token")
    ax_ttft.legend(fontsize=8)
    if with_gap:
        _plot_gap(axes[2], names, gaps)
    for ax in axes:
        ax.tick_params(axis="x", rotation=20)
    cfg = report["config"]
    fig.suptitle(f"kvmesh sim: {cfg['num_replicas']} replicas, {report['trace']['requests']} requests, "
                 f"time scale {cfg['time_scale']}", fontsize=10)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.24, top=0.84, wspace=0.25)  # tight_layout costs seconds
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _plot_gap(ax, names: list[str], gaps: list[dict]) -> None:
    """Stacked bars: points of hit rate lost (up) and won back (down) against the single pool."""
    parts = (("evicted_everywhere_points", 1, "evicted everywhere"), ("diverted_points", 1, "diverted (load)"),
             ("routing_admission_race_lost_points", 1, "race lost"),
             ("kept_beyond_pool_points", -1, "kept beyond the pool"),
             ("routing_admission_race_gained_points", -1, "race gained"))
    up, down = [0.0] * len(names), [0.0] * len(names)
    for key, sign, label in parts:
        values = [sign * g[key] for g in gaps]
        base = up if sign > 0 else down
        ax.bar(names, values, bottom=base, label=label)
        for i, v in enumerate(values):
            base[i] += v
    ax.plot(names, [g["gap_points"] for g in gaps], "k_", markersize=18, label="net gap")
    ax.axhline(0, color="k", linewidth=0.6)
    ax.set_yscale("symlog", linthresh=2)
    ax.set_ylabel("points of hit rate vs single pool")
    ax.set_title("Where the gap to the single pool goes")
    ax.legend(fontsize=7)


def plot_kv_transfer(report: dict, path: str | Path) -> Path:
    """The runs side by side where KV moves (``--pd-compare``, splits, peer pulls): TTFT, inter-token
    latency, hit rate (the part pulled from peers stacked on top) and the decode replicas' balance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pol = {n: s for n, s in report["policies"].items() if "transfers" in s}
    names = list(pol)
    x = list(range(len(names)))
    fig, (ax_ttft, ax_itl, ax_hit, ax_bal) = plt.subplots(1, 4, figsize=(18, 5.2))
    width = 0.38
    ax_ttft.bar([i - width / 2 for i in x], [pol[n]["ttft_s"]["p50"] for n in names], width, label="p50")
    ax_ttft.bar([i + width / 2 for i in x], [pol[n]["ttft_s"]["p99"] for n in names], width, label="p99")
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT (s, log scale)")
    ax_ttft.set_title("Time to first token")
    width = 0.27
    for k, (q, label) in enumerate((("p50", "p50"), ("p99", "p99"), ("p99.9", "p99.9"))):
        ax_itl.bar([i + (k - 1) * width for i in x], [1000 * pol[n]["transfers"]["inter_token_s"][q] for n in names],
                   width, label=label)
    ax_itl.set_yscale("log")
    ax_itl.set_ylabel("inter-token latency (ms, log scale)")
    ax_itl.set_title("Inter-token latency (decode steps)")
    pulled = [100 * pol[n]["transfers"]["pulled_hit_rate"] for n in names]
    ax_hit.bar(names, [100 * pol[n]["hit_rate"] - p for n, p in zip(names, pulled, strict=True)],
               color="tab:blue", label="own pool")
    ax_hit.bar(names, pulled, bottom=[100 * pol[n]["hit_rate"] - p for n, p in zip(names, pulled, strict=True)],
               color="tab:orange", label="pulled from a peer")
    ax_hit.set_ylabel("prompt tokens no replica computed (%)")
    ax_hit.set_title("Prefix reuse")
    balance = [pol[n]["transfers"]["decode_load_imbalance"] for n in names]
    ax_bal.plot(x, balance, "o", color="tab:green")  # max/mean >= 1: points above the even line, not bars
    ax_bal.axhline(1.0, color="k", linewidth=0.6, label="even")
    ax_bal.set_ylim(0.98, max(1.1, 1.05 * max(balance)))
    ax_bal.set_ylabel("max / mean busy time of decoding replicas")
    ax_bal.set_title("Decode load balance")
    for ax in (ax_ttft, ax_itl, ax_hit):
        ax.legend(fontsize=8)
    for ax in (ax_ttft, ax_itl, ax_hit, ax_bal):
        ax.set_xticks(x, names)
        ax.tick_params(axis="x", rotation=40, labelsize=8)
        plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
    cfg = report["config"]
    fig.suptitle(f"kvmesh sim, KV transfers: {report['trace']['requests']} requests, time scale {cfg['time_scale']}, "
                 f"{cfg['kv_transfer_bytes_per_s'] / 1e9:.1f} GB/s + {1e3 * cfg['kv_transfer_latency_s']:.2f} ms "
                 f"per transfer", fontsize=10)
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.34, top=0.88, wspace=0.3)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
