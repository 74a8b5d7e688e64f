"""The simulator's printed table and JSON file."""

from __future__ import annotations

import json
from pathlib import Path


def format_table(report: dict) -> str:
    ceil = report.get("ceilings", {})
    lines = [
        f"{report['config']['num_replicas']} replicas x {report['blocks_per_replica']} blocks of "
        f"{report['config']['block_size']} tokens (total {report['total_blocks']}; trace working set "
        f"{report['trace']['working_set_blocks']} blocks), {report['trace']['requests']} requests "
        f"over {report['trace']['duration_s']:.0f} s",
    ]
    if ceil:
        lines.append(f"ceilings: infinite cache {ceil['infinite_cache_hit_rate']:.1%}, "
                     f"single pool of the same total capacity {ceil['single_pool_hit_rate']:.1%}")
    width = max([16, *(len(name) + 2 for name in report["policies"])])
    header = (f"{'policy':<{width}}{'hit':>7}{'/pool':>7}{'capt':>6}{'mispred':>8}{'TTFT p50':>10}{'TTFT p99':>10}{'queue p50':>10}"
              f"{'queue p99':>10}{'max/mean':>9}{'events/s':>10}{'blocks/s':>10}{'cpu s':>7}")
    lines += [header, "-" * len(header)]
    for name, s in report["policies"].items():
        rel = s.get("hit_rate_vs_single_pool")
        rc = s.get("receipts", {})
        lines.append(
            f"{name:<{width}}{s['hit_rate']:>7.1%}{(f'{rel:.1%}' if rel is not None else '-'):>7}"
            f"{rc.get('captured_ratio', float('nan')):>6.0%}{rc.get('mispredicted_rate', float('nan')):>8.1%}"
            f"{s['ttft_s']['p50']:>10.3f}{s['ttft_s']['p99']:>10.3f}{s['queue_s']['p50']:>10.3f}"
            f"{s['queue_s']['p99']:>10.3f}{s['load_imbalance']:>9.2f}{s['events_per_s']:>10,.0f}"
            f"{s['index_blocks_per_s']:>10,.0f}{s['cpu_s']:>7.1f}")
    gaps = {n: s["gap_to_single_pool"] for n, s in report["policies"].items() if "gap_to_single_pool" in s}
    if gaps:
        lines.append("gap to the single pool, points of hit rate = evicted everywhere - kept beyond the pool "
                     "+ diverted + race lost - race gained:")
        for name, g in gaps.items():
            lines.append(f"  {name:<{width}}{g['gap_points']:6.2f} = {g['evicted_everywhere_points']:.2f} - "
                         f"{g['kept_beyond_pool_points']:.2f} + {g['diverted_points']:.2f} + "
                         f"{g['routing_admission_race_lost_points']:.2f} - "
                         f"{g['routing_admission_race_gained_points']:.2f}")
    return "\n".join(lines)


def write_json(report: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    return p
