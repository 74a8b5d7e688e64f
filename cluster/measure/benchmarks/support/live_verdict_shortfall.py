"""Where kvmesh's default misses the line the live verdict holds it to (``kvmesh bench live_verdict``'s results
files): against each real router, a cached share higher beyond the paired interval and a mean TTFT lower by more than
2% beyond it. A row per results file and router that misses, the missed figure in bold; round-robin arms are a
baseline, not a router users pick, and are left out."""

from __future__ import annotations

from kvmesh.cluster.measure.benchmarks.support.live_verdict_table import verdict_stats
from kvmesh.cluster.measure.loadgen.intervals import plus_minus

TTFT_LINE = -0.02
"""The line a mean TTFT is held to against each peer: lower than the peer's by more than 2%, the whole interval."""


def misses(vs: dict) -> tuple[bool, bool]:
    """Whether the paired intervals miss the line: (cached share not higher beyond its interval, mean TTFT not lower
    than the peer's by more than ``TTFT_LINE`` beyond its interval); an unknown figure misses."""
    hit, ttft = vs["hit_points"], vs["ttft_mean_ratio"]
    return hit is None or hit[0] - hit[1] <= 0, ttft is None or ttft[0] + ttft[1] >= TTFT_LINE


def table(results: list[dict]) -> str:
    """A row per results file and real router (round-robin arms are a baseline, not a router users pick) where
    kvmesh's default misses the line on its cached share or its mean TTFT, the missed figure in bold."""
    lines = ["| workload, rate | against | kvmesh minus it: cached (points) | kvmesh's mean TTFT / its - 1 |",
             "|---|---|---|---|"]
    for result in results:
        v = verdict_stats(result)
        where = f"{v['workload']}, {v['rate']:g}/s"
        for name, s in v["routers"].items():
            vs = s.get("vs_reference")
            if not vs or "round_robin" in name or "round-robin" in name or not any(misses(vs)):
                continue
            hit_missed, ttft_missed = misses(vs)
            hit = plus_minus(vs["hit_points"], "{:+.1f}")
            ttft = plus_minus(vs["ttft_mean_ratio"], "{:+.0f}", 100, "%")
            lines.append(f"| {where} | {name} | {f'**{hit}**' if hit_missed else hit} | "
                         f"{f'**{ttft}**' if ttft_missed else ttft} |")
    return "\n".join(lines)
