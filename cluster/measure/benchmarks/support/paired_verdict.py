"""The verdict of one matrix cell over arrival seeds: for each rival policy and metric, the paired difference
default - rival over the seeds (every policy of a seed saw the same arrivals) with its 95% interval (Student's t),
judged against a margin.

A metric's difference is in points for a share (hit rate as a share of the single pool, goodput) and relative to
the rival for a time (TTFT mean, p50, p99). The rival is *better beyond the margin* where the default trails it by
more than ``Metric.margin``; the verdict of a (rival, metric) pair is

- ``fail``: the whole interval lies beyond the margin (the rival is better, and not by noise);
- ``pass``: the whole interval lies on the default's side of the margin (no rival better beyond it);
- ``undecided``: the interval straddles the margin: more seeds, not a verdict.

A cell fails when any pair fails, is undecided when none fails and some pair straddles, and passes otherwise.
The default *beats* a rival when some primary metric's whole interval lies beyond the margin on the default's side.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.cluster.measure.benchmarks.headline import interval

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"


@dataclass(frozen=True, slots=True)
class Metric:
    """One figure the verdict compares."""

    name: str
    """Key of the figure in a seed's per-policy figures."""
    label: str
    """Column name in the tables."""
    higher_is_better: bool
    """A share (higher is better, difference in points) or a time (lower is better, difference relative)."""
    margin: float
    """How far the rival may be better and the default still pass: a fraction (0.003 = 0.3 points, 0.02 = 2%)."""
    primary: bool
    """Primary metrics decide whether the default beats a rival; secondary ones only whether it fails."""


METRICS = (Metric("hit_share", "hit (of pool)", True, 0.003, True),
           Metric("ttft_mean", "TTFT mean", False, 0.02, True),
           Metric("good_share", "goodput", True, 0.005, True),
           Metric("ttft_p50", "TTFT p50", False, 0.03, False),
           Metric("ttft_p99", "TTFT p99", False, 0.05, False))
"""The verdict's metrics and margins: hit rate as a share of the single-pool ceiling (0.3 points), mean TTFT (2%),
goodput, the share of requests within the workload's TTFT SLO (0.5 points); TTFT p50 (3%) and p99 (5%)."""


@dataclass(frozen=True, slots=True)
class Paired:
    """The paired difference default - rival of one metric over the seeds: mean and 95% interval."""

    mean: float
    low: float
    high: float
    seeds: int

    def describe(self, metric: Metric) -> str:
        """``+1.2 pt [+0.8, +1.6]`` (shares) or ``-3.1% [-4.0, -2.2]`` (times, relative to the rival)."""
        unit = " pt" if metric.higher_is_better else "%"
        return f"{100 * self.mean:+.1f}{unit} [{100 * self.low:+.1f}, {100 * self.high:+.1f}]"


def difference(metric: Metric, mine: float, theirs: float) -> float:
    """One seed's difference default - rival: in fractions of a share, or relative to the rival's time."""
    if metric.higher_is_better:
        return mine - theirs
    return (mine - theirs) / theirs if theirs > 0 else 0.0


def paired(metric: Metric, mine: list[float], theirs: list[float]) -> Paired:
    """The mean and 95% t-interval of the per-seed differences (``mine[k]`` and ``theirs[k]`` share seed k)."""
    if len(mine) != len(theirs) or not mine:
        raise ValueError(f"paired seeds needed: {len(mine)} figures of the default, {len(theirs)} of the rival")
    mean, half = interval([difference(metric, a, b) for a, b in zip(mine, theirs, strict=True)])
    return Paired(mean, mean - half, mean + half, len(mine))


def judge(metric: Metric, p: Paired) -> str:
    """``fail``, ``pass`` or ``undecided`` for one rival on one metric (see the module's rule)."""
    if metric.higher_is_better:  # the rival is better beyond the margin where default - rival < -margin
        worse, clear = p.high < -metric.margin, p.low > -metric.margin
    else:  # lower is better: the rival is better beyond the margin where (default - rival) / rival > margin
        worse, clear = p.low > metric.margin, p.high < metric.margin
    return FAIL if worse else PASS if clear else UNDECIDED


def beats(metric: Metric, p: Paired) -> bool:
    """Whether the default is better than the rival beyond the margin, its whole interval clear of it."""
    return p.low > metric.margin if metric.higher_is_better else p.high < -metric.margin


def cell_verdict(judged: dict[str, dict[str, str]]) -> str:
    """A cell's verdict from {rival: {metric: verdict}}: fail if any fails, undecided if any straddles, else pass."""
    marks = [v for per_rival in judged.values() for v in per_rival.values()]
    return FAIL if FAIL in marks else UNDECIDED if UNDECIDED in marks else PASS


def judge_cell(seeds: list[dict[str, dict[str, float]]], default: str) -> dict:
    """A cell's seeds (each {policy: {metric name: figure}}) -> the paired differences against every rival, each
    pair's verdict, the rivals the default beats, and the cell's verdict. A rival is paired only where every seed ran
    it: one being run again on a new formula (``--refresh``, seed by seed) is left out of the cell until it has."""
    rivals = [name for name in seeds[0] if name != default and all(name in s for s in seeds)]
    diffs = {r: {m.name: paired(m, [s[default][m.name] for s in seeds], [s[r][m.name] for s in seeds])
                 for m in METRICS} for r in rivals}
    by_name = {m.name: m for m in METRICS}
    judged = {r: {k: judge(by_name[k], p) for k, p in d.items()} for r, d in diffs.items()}
    beaten = [r for r, d in diffs.items() if any(m.primary and beats(m, d[m.name]) for m in METRICS)]
    return {"seeds": len(seeds), "verdict": cell_verdict(judged), "pairs": judged, "diffs": diffs,
            "beaten": beaten}
