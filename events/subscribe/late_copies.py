"""Live batches a replay or snapshot had already delivered, reaching the SUB socket after it.

A batch published just before a snapshot was taken (or a replay read) can arrive on the live socket after that
answer: it is a late copy, not a publisher that restarted. For ``COVERED_LATE_S`` after a recovery, a live seq going
back to or below the last seq the recovery delivered (seq > 0) is such a copy and dropped
(``SourceStats.covered_late``); later, or at seq 0, a seq going back is a new publisher (a restarted replica takes
longer than this to publish again).
"""

from __future__ import annotations

import time

COVERED_LATE_S = 2.0
"""Seconds after a recovery during which a seq going back is taken as a late copy."""


class LateCopies:
    """The last recovery's reach (the module doc), for one source."""

    def __init__(self, window_s: float = COVERED_LATE_S) -> None:
        self.window_s = window_s
        self._recovered: tuple[int, float] | None = None  # (last seq a replay or snapshot delivered, when)

    def recovered(self, last: int) -> None:
        """A replay or snapshot delivered everything up to ``last``."""
        self._recovered = (last, time.monotonic())

    def covers(self, seq: int) -> bool:
        """Whether a live ``seq`` going back is a late copy of what the last recovery delivered."""
        r = self._recovered
        return seq > 0 and r is not None and seq <= r[0] and time.monotonic() - r[1] <= self.window_s
