"""Summary statistics of a run's measurements: percentiles (plain and weighted by counts) and balance."""

from __future__ import annotations

import numpy as np


def percentiles(values, qs=(50, 90, 99)) -> dict[str, float]:
    if len(values) == 0:
        return {f"p{q}": float("nan") for q in qs} | {"mean": float("nan")}
    arr = np.asarray(values, dtype=float)
    out = {f"p{q}": float(np.percentile(arr, q)) for q in qs}
    out["mean"] = float(arr.mean())
    return out


def imbalance(values) -> float:
    """max / mean (1.0 = perfectly even); 1.0 when nothing ran."""
    arr = np.asarray(values, dtype=float)
    mean = arr.mean() if len(arr) else 0.0
    return float(arr.max() / mean) if mean > 0 else 1.0


def weighted_percentiles(histogram: dict[float, int], qs=(50, 90, 99, 99.9)) -> dict[str, float]:
    """Percentiles and mean of values given as value -> count."""
    if not histogram:
        return {f"p{q:g}": float("nan") for q in qs} | {"mean": float("nan")}
    values = np.array(sorted(histogram), dtype=float)
    counts = np.array([histogram[v] for v in sorted(histogram)], dtype=float)
    cum = np.cumsum(counts) / counts.sum()
    out = {f"p{q:g}": float(values[min(len(values) - 1, int(np.searchsorted(cum, q / 100)))]) for q in qs}
    out["mean"] = float((values * counts).sum() / counts.sum())
    return out
