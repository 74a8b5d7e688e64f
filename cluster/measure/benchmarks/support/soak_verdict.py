"""What ``kvmesh bench soak`` concludes: every request's outcome counted by kind (``SoakTally``), each process's memory
growth after the warm-up (``growth``) and the verdict (``verdict``). Pure arithmetic on what the run recorded.

A process's memory at the warm-up mark is the median of its samples in ``[warmup, warmup + window]``, at the end the
median of those in ``[end - window, end]`` (a median of a few samples, so one sample taken in a burst of allocation
neither makes nor hides a trend); growth is ``end / at_warmup - 1``. The verdict passes when every process grew at
most ``max_growth``, no well-formed request failed, every hostile one got a clean 4xx, and every process was alive at
the end.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

FAILURES_KEPT = 100
"""Failures recorded one by one (with their time); beyond it they are only counted by reason."""


@dataclass
class SoakTally:
    """Requests by kind: sent, succeeded (well-formed: complete; hostile: a clean 4xx) and failed, with reasons."""

    kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    hostile_labels: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    failures: list[dict] = field(default_factory=list)

    def record(self, kind: str, reason: str | None, t: float, hostile_label: str | None = None) -> None:
        """One request of ``kind`` (``"hostile"`` with its ``hostile_label``) ended at ``t``: ``reason`` is ``None``
        when it got what it must, else why not."""
        row = self.kinds.setdefault(kind, {"sent": 0, "ok": 0, "failed": 0})
        row["sent"] += 1
        if hostile_label is not None:
            self.hostile_labels[hostile_label] += 1
        if reason is None:
            row["ok"] += 1
            return
        row["failed"] += 1
        what = f"{kind}{f' ({hostile_label})' if hostile_label else ''}: {reason[:120]}"
        self.reasons[what] += 1
        if len(self.failures) < FAILURES_KEPT:
            self.failures.append({"t": round(t, 1), "kind": kind, "reason": what})

    def failed(self, hostile: bool) -> int:
        return sum(row["failed"] for kind, row in self.kinds.items() if (kind == "hostile") == hostile)

    def total(self) -> int:
        return sum(row["sent"] for row in self.kinds.values())

    def as_dict(self) -> dict:
        return {"by_kind": self.kinds, "hostile_cases": dict(sorted(self.hostile_labels.items())),
                "well_formed_failed": self.failed(hostile=False), "hostile_misanswered": self.failed(hostile=True),
                "failure_reasons": dict(self.reasons.most_common()), "failures": self.failures}


def growth(samples: list[dict], name: str, warmup_s: float, window_s: float) -> dict:
    """Process ``name``'s memory at the warm-up mark and at the end, its growth between, and its peak after the mark
    (``samples``: ``{"t": s, "rss_mb": {name: MB}}`` in time order)."""
    series = [(s["t"], s["rss_mb"][name]) for s in samples if name in s["rss_mb"]]
    if not series or series[-1][0] < warmup_s:
        raise ValueError(f"{name}: no sample after the warm-up mark ({warmup_s:g} s)")
    end = series[-1][0]
    at_mark = [v for t, v in series if warmup_s <= t <= warmup_s + window_s]
    at_end = [v for t, v in series if t >= max(end - window_s, warmup_s)]
    start, last = statistics.median(at_mark), statistics.median(at_end)
    return {"at_warmup_mb": round(start, 1), "at_end_mb": round(last, 1), "growth": round(last / start - 1, 4),
            "peak_after_warmup_mb": round(max(v for t, v in series if t >= warmup_s), 1),
            "first_mb": round(series[0][1], 1)}


def trend_mb_per_10min(samples: list[dict], name: str, warmup_s: float) -> float:
    """The least-squares slope of process ``name``'s memory after the warm-up mark, MB per 10 minutes (a steady
    climb within the bound shows here: what a longer run would add)."""
    series = [(s["t"], s["rss_mb"][name]) for s in samples if name in s["rss_mb"] and s["t"] >= warmup_s]
    if len(series) < 2:
        return 0.0
    mean_t = sum(t for t, _ in series) / len(series)
    mean_v = sum(v for _, v in series) / len(series)
    spread = sum((t - mean_t) ** 2 for t, _ in series)
    return 600 * sum((t - mean_t) * (v - mean_v) for t, v in series) / spread if spread else 0.0


def verdict(samples: list[dict], names: list[str], tally: SoakTally, *, warmup_s: float, window_s: float,
            max_growth: float, exited: list[str]) -> dict:
    """Each process's growth (``growth``) and whether the run passes (the module doc)."""
    per = {name: growth(samples, name, warmup_s, window_s) for name in names}
    for row in per.values():
        row["within"] = row["growth"] <= max_growth
    ok = (all(row["within"] for row in per.values()) and tally.failed(hostile=False) == 0
          and tally.failed(hostile=True) == 0 and not exited and tally.total() > 0)
    return {"processes": per, "max_growth": max_growth, "exited": exited, "ok": ok}
