"""Replications of a trace: each request arrives at a time drawn inside its timestamp's tick (``kvmesh sim
--arrival-seed K``).

A trace's timestamps have a resolution. Where many requests share a stamp, the clock is coarse: the tick is the
greatest common step of the distinct stamps (their median gap when that step is much finer than the gaps), and each
request arrives uniformly inside ``[stamp, stamp + tick)``, instead of a tick's requests all at one instant, a burst
no client sends. Where stamps are distinct, each arrival moves forward by a uniform share of ``JITTER_SHARE`` x the
mean gap. One seed gives one set of arrivals; every policy of a comparison replays the same one (common random
numbers), and another seed is another replication.

Bursts (``--arrival-clock-ms``, ``--arrival-spread order``): the stamps moved down onto a coarse clock keep a tick's
requests together, as a trace logged in whole seconds replays them; the seed then draws only the order of the
requests inside each tick (which one is routed first, and which router takes it), not their time.

Fan-outs (``--arrival-spread fanout``): a tick's requests arrive within ``--fanout-ms`` of its start, each at a time
drawn uniformly inside that window, as an agent's or a batch client's calls a few milliseconds apart: a burst with a
width, where routers that tell each other their choices within less than the gaps see them.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, replace

from kvmesh.cluster.measure.workloads.traces import MooncakeRecord

SHARED_STAMPS = 1.5
"""Requests per distinct stamp from which the stamps are read as a coarse clock (ticks), below it as distinct."""
JITTER_SHARE = 0.5
"""Where stamps are distinct: an arrival moves forward by up to this share of the mean gap."""
ARRIVAL_SPREADS = ("jitter", "order", "fanout")
"""What an arrival seed varies in a trace (``SimWorkloadOptions.arrival_spread``): the times inside a tick, only the
order of a tick's requests, which then arrive together, or their times inside the first few milliseconds of it."""
FINE_STEP = 0.1
"""A common step below this share of the median gap is no tick (irregular stamps): the median gap is the tick."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """How a trace's timestamps are spread (``detect``)."""

    tick_ms: float
    """Width of the window an arrival is drawn in, in milliseconds."""
    coarse: bool
    """Whether many requests share a stamp (a tick) rather than stamps being distinct (a jitter)."""
    per_stamp: float
    """Requests per distinct stamp."""

    def describe(self, seed: int) -> str:
        """One line for the output: which spread, how wide, which seed."""
        if self.coarse:
            return (f"arrival seed {seed}: timestamps on a {self.tick_ms:g} ms clock ({self.per_stamp:.1f} requests "
                    f"per stamp); each request arrives uniformly inside its tick")
        return (f"arrival seed {seed}: distinct timestamps ({self.per_stamp:.2f} requests per stamp); each request "
                f"arrives up to {self.tick_ms:.1f} ms ({JITTER_SHARE:g} x the mean gap) after its stamp")


def _common_step(gaps: list[float]) -> float:
    """The greatest common step of the gaps, at microsecond precision."""
    step = 0
    for g in gaps:
        step = math.gcd(step, round(g * 1000))
    return step / 1000


def detect(records: list[MooncakeRecord]) -> Resolution:
    """The resolution of ``records``' timestamps."""
    stamps = sorted({r.timestamp_ms for r in records})
    per_stamp = len(records) / max(1, len(stamps))
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    if not gaps:
        return Resolution(0.0, False, per_stamp)
    if per_stamp >= SHARED_STAMPS:
        step, median = _common_step(gaps), statistics.median(gaps)
        return Resolution(step if step >= FINE_STEP * median else median, True, per_stamp)
    return Resolution(JITTER_SHARE * (stamps[-1] - stamps[0]) / len(gaps), False, per_stamp)


def spread_arrivals(records: list[MooncakeRecord], seed: int,
                    clock_ms: float | None = None) -> tuple[list[MooncakeRecord], str]:
    """``records`` with each arrival drawn inside its tick (``detect``, or ``clock_ms`` where the stamps were put on
    that clock), in arrival order, and the line saying how."""
    resolution = detect(records) if clock_ms is None else Resolution(clock_ms, True, detect(records).per_stamp)
    rng = random.Random(seed)
    moved = [replace(r, timestamp_ms=r.timestamp_ms + rng.random() * resolution.tick_ms) for r in records]
    moved.sort(key=lambda r: r.timestamp_ms)
    return moved, resolution.describe(seed)


def on_clock(records: list[MooncakeRecord], clock_ms: float) -> list[MooncakeRecord]:
    """``records`` stamped on a clock of ``clock_ms``: each arrival moved down to its tick's start (a tick's requests
    then arrive together), in their order."""
    return [replace(r, timestamp_ms=math.floor(r.timestamp_ms / clock_ms) * clock_ms) for r in records]


def shuffle_ticks(records: list[MooncakeRecord], seed: int) -> tuple[list[MooncakeRecord], str]:
    """``records`` on their stamps, the order of the requests sharing a stamp drawn by ``seed``, and the line
    saying how."""
    rng = random.Random(seed)
    keyed = sorted((r.timestamp_ms, rng.random(), i) for i, r in enumerate(records))
    per_stamp = len(records) / max(1, len({r.timestamp_ms for r in records}))
    return ([records[i] for _, _, i in keyed],
            f"arrival seed {seed}: each stamp's requests arrive together ({per_stamp:.1f} per stamp); their order "
            f"within it drawn")


def fan_out(records: list[MooncakeRecord], seed: int, width_ms: float,
            replay_width_ms: float | None = None) -> tuple[list[MooncakeRecord], str]:
    """``records`` with each arrival drawn uniformly inside ``[stamp, stamp + width_ms)``, in arrival order, and the
    line saying how (``replay_width_ms``: the window's width as the replay runs it, when a time scale changes it)."""
    rng = random.Random(seed)
    moved = [replace(r, timestamp_ms=r.timestamp_ms + rng.random() * width_ms) for r in records]
    moved.sort(key=lambda r: r.timestamp_ms)
    per_stamp = len(records) / max(1, len({r.timestamp_ms for r in records}))
    shown = width_ms if replay_width_ms is None else replay_width_ms
    return moved, (f"arrival seed {seed}: each stamp's requests ({per_stamp:.1f} per stamp) arrive within {shown:g} ms "
                   "of it, each at a time drawn uniformly inside that window")


def redraw_seed(seed: int, arrival_seed: int) -> int:
    """A generated workload's seed for replication ``arrival_seed`` of a run seeded ``seed``."""
    return random.Random(f"{seed}/{arrival_seed}").getrandbits(32)
