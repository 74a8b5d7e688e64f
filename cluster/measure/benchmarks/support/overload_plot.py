"""The plot of ``kvmesh bench overload``: TTFT over time per class, and every request's outcome per phase."""

from __future__ import annotations

from collections import Counter

from kvmesh.cluster.measure.benchmarks.support.overload_report import OUTCOMES

COLORS = {"light": "tab:green", "flood": "tab:red", "high": "tab:blue", "bulk": "tab:orange"}
OUTCOME_COLORS = {"ok": "tab:green", "429": "tab:olive", "4xx": "tab:purple", "5xx": "tab:red", "timeout": "black",
                  "error": "tab:brown", "stream_error": "tab:pink", "cancelled": "tab:gray", "not_sent": "lightgray"}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = result["requests"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8), gridspec_kw={"height_ratios": [3, 2]})
    top = max([r["ttft_s"] for r in records if r["ttft_s"] is not None] or [1.0]) * 2
    for cls, color in COLORS.items():
        got = [(r["t"], r["ttft_s"]) for r in records if r["cls"] == cls and r["ttft_s"] is not None]
        never = [r["t"] for r in records if r["cls"] == cls and r["ttft_s"] is None and r["outcome"] != "not_sent"]
        crowd = cls in ("flood", "bulk")  # many small dots, under the few that matter
        if got:
            ax1.plot(*zip(*got, strict=True), "." if crowd else "o", color=color, markersize=3 if crowd else 5,
                     label=f"{cls} TTFT", alpha=0.5 if crowd else 1.0, zorder=2 if crowd else 3,
                     markeredgecolor="none" if crowd else "black", markeredgewidth=0.5)
        if never:
            ax1.plot(never, [top * (1.0 if crowd else 1.15)] * len(never), "x", color=color, markersize=4,
                     label=f"{cls}: no first token", zorder=2 if crowd else 3)
    for name, span in result["phase_times"].items():
        ax1.axvline(span["start"], color="gray", linestyle=":", linewidth=0.8)
        ax1.text(span["start"], top * 1.3, name, fontsize=7, rotation=0, va="bottom")
    target = result["config"]["high_target_s"]
    ax1.axhline(target, color="tab:blue", linestyle="--", linewidth=0.8, label=f"high-priority target {target:g} s")
    ax1.set_yscale("log")
    ax1.set_ylabel("TTFT (s)")
    ax1.set_xlabel("send time (s since the run began)")
    ax1.legend(fontsize=7, loc="lower right", ncols=2)
    groups = list(dict.fromkeys((r["phase"], r["cls"]) for r in records))
    counts = {g: Counter(r["outcome"] for r in records if (r["phase"], r["cls"]) == g) for g in groups}
    bottom = [0] * len(groups)
    for outcome in OUTCOMES:
        heights = [counts[g][outcome] for g in groups]
        if any(heights):
            ax2.bar(range(len(groups)), heights, bottom=bottom, color=OUTCOME_COLORS[outcome], label=outcome)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax2.set_xticks(range(len(groups)), [f"{p}\n{c}" for p, c in groups], fontsize=7)
    ax2.set_ylabel("requests")
    ax2.set_yscale("symlog")
    if groups:
        ax2.legend(fontsize=7, ncols=3)
    verdict = "PASS" if result["verdict"]["pass"] else "FAIL"
    fig.suptitle(f"kvmesh bench overload {result['variant']['label']}: acceptance {verdict}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
