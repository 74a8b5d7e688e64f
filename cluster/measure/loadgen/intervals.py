"""A mean over replications and its 95% interval (Student's t), for the tables that compare runs."""

from __future__ import annotations

import math
import statistics

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
         2.042)
"""Student's t 97.5% quantile for 1..30 degrees of freedom (1.96 beyond)."""


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of its 95% interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    df = len(values) - 1
    t = T_975[df - 1] if df <= len(T_975) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def known_interval(values: list[float | None]) -> tuple[float, float] | None:
    """``interval``, or None where a run lacks the figure (None, or nan: an arm on another fleet, without replica
    counters or per-request TTFTs)."""
    if any(v is None or math.isnan(v) for v in values):
        return None
    return interval(values)  # type: ignore[arg-type]


def plus_minus(pair: tuple[float, float] | list[float] | None, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    """``mean ± half`` of an interval, scaled, with its unit; "-" for a figure the run does not have."""
    if pair is None:
        return "-"
    mean, half = pair
    return f"{fmt.format(scale * mean)} ± {fmt.replace('+', '').format(scale * half)}{unit}"
