"""Whether a source's stream can be trusted: bad frames in a sliding window, and the degraded flag.

A bad frame (undecodable, over a limit, or rejected by the consumer) is dropped and counted. One
is noise; ``threshold`` of them within ``window_s`` mean the source is broken or hostile: it is
*degraded* -- the consumer stops trusting what it says about its cache (the router routes to it
by load only) -- until a snapshot resync replaces everything it said before, or, for a source
without snapshots, until it has sent no bad frame for a whole window::

    ok ──threshold bad frames within window_s──▶ degraded ──snapshot applied / clean window──▶ ok
"""

from __future__ import annotations

from collections import deque


class SourceHealth:
    """Bad-frame bookkeeping of one source (see the module doc). Owned by the I/O thread."""

    __slots__ = ("threshold", "window_s", "_bad", "degraded", "reason")

    def __init__(self, threshold: int, window_s: float) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self._bad: deque[float] = deque(maxlen=threshold)
        self.degraded = False
        self.reason = ""
        """Why the source was degraded (the last bad frame's description)."""

    def record_bad(self, now: float, what: str) -> bool:
        """Count one bad frame at ``now``; True when this one degrades the source."""
        self._bad.append(now)
        if self.degraded or len(self._bad) < self.threshold or now - self._bad[0] > self.window_s:
            return False
        self.degraded = True
        self.reason = f"{self.threshold} bad frames within {self.window_s:g}s (last: {what})"
        return True

    def clean_for(self, now: float) -> bool:
        """True when no bad frame arrived in the last window."""
        return not self._bad or now - self._bad[-1] > self.window_s

    def recover(self) -> bool:
        """Trust the source again (after a resync); True if it was degraded."""
        was = self.degraded
        self.degraded, self.reason = False, ""
        self._bad.clear()
        return was
