"""The plot of ``kvmesh bench soak``: each process's resident memory over the run, the warm-up mark, and the bound
its end must stay under (the memory at the mark plus the allowed growth)."""

from __future__ import annotations

COLORS = {"router": "tab:blue", "replica-0": "tab:orange", "replica-1": "tab:green"}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, v = result["samples"], result["verdict"]
    warmup = result["setup"]["warmup_s"]
    fig, ax = plt.subplots(figsize=(10, 5))
    for name, row in v["processes"].items():
        color = COLORS.get(name)
        pts = [(s["t"] / 60, s["rss_mb"][name]) for s in samples if name in s["rss_mb"]]
        ax.plot(*zip(*pts, strict=True), color=color, linewidth=1.2,
                label=f"{name}: {row['at_warmup_mb']:.0f} -> {row['at_end_mb']:.0f} MB ({100 * row['growth']:+.1f}%)")
        bound = row["at_warmup_mb"] * (1 + v["max_growth"])
        ax.hlines(bound, warmup / 60, pts[-1][0], colors=color, linestyles=":", linewidth=0.8)
    ax.axvline(warmup / 60, color="gray", linestyle="--", linewidth=0.8)
    ax.text(warmup / 60, ax.get_ylim()[1], " warm-up mark", va="top", fontsize=8, color="gray")
    counts = result["requests"]
    ax.set_title(f"kvmesh bench soak: resident memory per process tree ({counts['well_formed_sent']} well-formed "
                 f"requests, {counts['well_formed_failed']} failed; {counts['hostile_sent']} hostile)\n"
                 f"dotted: the memory at the warm-up mark + {100 * v['max_growth']:.0f}%", fontsize=9)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
