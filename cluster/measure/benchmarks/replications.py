"""Replications of one ``kvmesh sim`` comparison (``--arrival-seed`` 0..N-1, one report each) as one table: per
policy, the mean over the seeds and its 95% interval (Student's t), the default first."""

from __future__ import annotations

import math
import statistics

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086)
"""Student's t 97.5% quantile for 1..20 degrees of freedom (1.96 beyond)."""


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of its 95% interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    df = len(values) - 1
    t = T_975[df - 1] if df <= len(T_975) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def _check(docs: list[dict]) -> None:
    """Every report one replication of the same comparison: an arrival seed each, the same policies."""
    seeds = [d["trace"].get("arrivals", "").split(":")[0] for d in docs]
    if not all(seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"replications need one report per distinct --arrival-seed; got {seeds}")
    names = [list(d["policies"]) for d in docs]
    if any(n != names[0] for n in names):
        raise ValueError("replications need the same policies in every report")


METRICS = (("of the single-pool ceiling", lambda p: 100 * p["hit_rate_vs_single_pool"], "{:.1f}%"),
           ("mean TTFT", lambda p: p["ttft_s"]["mean"], "{:.3f} s"),
           ("TTFT p50", lambda p: p["ttft_s"]["p50"], "{:.3f} s"),
           ("TTFT p99", lambda p: p["ttft_s"]["p99"], "{:.2f} s"))
"""The columns: name, the figure of one run, its format."""


def table(docs: list[dict]) -> str:
    """The replications as a table, a row per policy: mean ± half-width of the 95% interval of each metric."""
    from kvmesh.router.routing.policies import DEFAULT_POLICY

    _check(docs)
    rows = []
    for name in docs[0]["policies"]:
        cells = [interval([get(d["policies"][name]) for d in docs]) for _, get, _ in METRICS]
        rows.append((name, cells))
    rows.sort(key=lambda r: (r[0] != DEFAULT_POLICY, -r[1][0][0]))
    out = [f"| policy ({len(docs)} arrival seeds) | {' | '.join(m for m, _, _ in METRICS)} |",
           "|---" * (len(METRICS) + 1) + "|"]
    for name, cells in rows:
        label = f"**{name}** (the default)" if name == DEFAULT_POLICY else name
        figures = [f"{fmt.format(mean)} ± {fmt.format(half).replace(' s', '').replace('%', '')}"
                   for (mean, half), (_, _, fmt) in zip(cells, METRICS, strict=True)]
        out.append(f"| {label} | {' | '.join(figures)} |")
    return "\n".join(out)
