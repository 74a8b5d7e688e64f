"""What LoRA adapters did in a simulation report (sim/lora.py's ``lora_summary`` per run): a table and a plot of
hit rate, TTFT and adapter loads per policy, adapter-aware beside adapter-blind."""

from __future__ import annotations

from pathlib import Path


def has_lora(report: dict) -> bool:
    """Whether any run of the report served adapter requests."""
    return any("lora" in s for s in report["policies"].values())


def format_lora_table(report: dict) -> str:
    """One line per run: hit rate, TTFT p50/p99, adapter loads and slot waits."""
    runs = {name: s for name, s in report["policies"].items() if "lora" in s}
    width = max([16, *(len(name) + 2 for name in runs)])
    header = (f"{'LoRA adapters':<{width}}{'hit':>7}{'TTFT p50':>10}{'TTFT p99':>10}{'loads':>8}{'per req':>9}"
              f"{'load s':>8}{'waited':>8}{'per replica':>12}")
    lines = [header, "-" * len(header)]
    for name, s in runs.items():
        lo = s["lora"]
        lines.append(f"{name:<{width}}{s['hit_rate']:>7.1%}{s['ttft_s']['p50']:>10.3f}{s['ttft_s']['p99']:>10.3f}"
                     f"{lo['adapter_loads']:>8}{lo['adapter_loads_per_request']:>9.3f}{lo['adapter_load_s']:>8.2f}"
                     f"{lo['slot_wait_share']:>8.1%}{lo['adapters_per_replica_mean']:>12.1f}")
    lines.append("loads: adapter loads into a device slot; waited: adapter requests passed over for a slot at least "
                 "once; per replica: adapters a replica served (mean)")
    return "\n".join(lines)


def plot_lora(report: dict, path: str | Path) -> Path:
    """Hit rate, TTFT p50/p99 and adapter loads per request of every run with adapters, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: s for name, s in report["policies"].items() if "lora" in s}
    names = list(runs)
    x = list(range(len(names)))
    colors = ["tab:blue" if "blind" not in n else "tab:gray" for n in names]
    fig, (ax_hit, ax_ttft, ax_loads) = plt.subplots(1, 3, figsize=(17, 4.6))
    ax_hit.bar(x, [100 * runs[n]["hit_rate"] for n in names], color=colors)
    ax_hit.set_ylabel("prefix hit rate (% of prompt tokens)")
    ax_hit.set_title("Prefix cache hit rate")
    w = 0.38
    ax_ttft.bar([i - w / 2 for i in x], [runs[n]["ttft_s"]["p50"] for n in names], w, label="p50")
    ax_ttft.bar([i + w / 2 for i in x], [runs[n]["ttft_s"]["p99"] for n in names], w, label="p99")
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT (s, log scale)")
    ax_ttft.set_title("Time to first token")
    ax_ttft.legend(fontsize=8)
    ax_loads.bar(x, [runs[n]["lora"]["adapter_loads_per_request"] for n in names], color=colors)
    ax_loads.set_ylabel("adapter loads per adapter request")
    ax_loads.set_title("Adapter loads into a slot")
    for ax in (ax_hit, ax_ttft, ax_loads):
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    cfg = report["config"]
    fig.suptitle(f"{cfg['num_replicas']} replicas, max_loras {cfg['lora']['max_loras']}: "
                 "adapter-aware (blue) vs adapter-blind (gray) routing")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
