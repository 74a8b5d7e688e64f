"""The admission comparison's PNG (overload.py): goodput by load factor with admission on and off, TTFT p99 of
each priority class, and what admission shed."""

from __future__ import annotations

from pathlib import Path


def plot_overload(result: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["levels"]
    loads = [row["load"] for row in rows]
    labels = [f"{k:g}x" for k in loads]
    fig, (ax_good, ax_ttft, ax_shed) = plt.subplots(1, 3, figsize=(16, 4.2))
    for side, style in (("off", "o--"), ("on", "s-")):
        ax_good.plot(labels, [row[side]["goodput"]["goodput_rps"] for row in rows], style,
                     label=f"admission {side}")
    ax_good.axhline(result["capacity_rps"], linestyle=":", color="k", label="fleet capacity")
    ax_good.set_xlabel("offered load (x the fleet's capacity)")
    ax_good.set_ylabel("goodput (requests meeting targets / s)")
    ax_good.set_title("Goodput")
    ax_good.legend(fontsize=8)
    priorities = sorted({p for row in rows for side in ("off", "on") for p in row[side]["goodput"]["per_priority"]},
                        key=int)
    bars = [(side, p) for p in priorities for side in ("off", "on")]
    width = 0.8 / len(bars)
    for j, (side, p) in enumerate(bars):
        values = [row[side]["goodput"]["per_priority"].get(p, {}).get("ttft_s", {}).get("p99", float("nan"))
                  for row in rows]
        ax_ttft.bar([i - 0.4 + width * (j + 0.5) for i in range(len(rows))], values, width,
                    label=f"priority {p}, admission {side}", hatch="" if side == "on" else "//")
    ax_ttft.set_xticks(range(len(rows)), labels)
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT p99 of the served (s, log scale)")
    ax_ttft.set_title("TTFT p99 per priority")
    ax_ttft.legend(fontsize=7)
    tenants = sorted({t for row in rows for t in row["on"]["goodput"]["per_tenant"]})
    width = 0.8 / max(1, len(tenants))
    for j, t in enumerate(tenants):
        ax_shed.bar([i - 0.4 + width * (j + 0.5) for i in range(len(rows))],
                    [100 * row["on"]["goodput"]["per_tenant"].get(t, {}).get("shed_rate", 0.0) for row in rows],
                    width, label=t)
    ax_shed.set_xticks(range(len(rows)), labels)
    ax_shed.set_ylabel("% of the tenant's requests shed (429)")
    ax_shed.set_title("Shed with admission on, per tenant")
    ax_shed.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
