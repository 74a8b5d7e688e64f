"""Plots of a simulation report: hit rate (against both ceilings) and TTFT per policy."""

from __future__ import annotations

from pathlib import Path


def plot_report(report: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["policies"])
    pol = report["policies"]
    fig, (ax_hit, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
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
    for ax in (ax_hit, ax_ttft):
        ax.tick_params(axis="x", rotation=20)
    cfg = report["config"]
    fig.suptitle(f"kvmesh sim: {cfg['num_replicas']} replicas, {report['trace']['requests']} requests, "
                 f"time scale {cfg['time_scale']}", fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.2, top=0.84, wspace=0.25)  # tight_layout costs seconds
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
