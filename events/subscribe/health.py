"""Whether a source's stream can be trusted: bad frames in a sliding window, and the degraded flag.

A bad frame (undecodable, over a limit, or rejected by the consumer) is dropped and counted. One
is noise; ``threshold`` of them within ``window_s`` mean the source is broken or hostile: it is
*degraded* -- the consumer stops trusting what it says about its cache (the router routes to it
by load only) -- until a snapshot resync has replaced everything it said before and it then sent
no bad frame for ``probation_s``; a source without snapshots needs a whole clean window::

    ok ──threshold bad frames within window_s──▶ degraded ──snapshot applied, then probation_s
                                                            without a bad frame──▶ ok

The statuses a consumer hears about a source (``on_status(name, status, detail)``) are named here too.
"""

from __future__ import annotations

from collections import deque

DEGRADED = "degraded"
"""The source sent ``threshold`` bad frames within ``window_s``: route to it by load only (frame_guard.py)."""
RECOVERED = "recovered"
"""A degraded source is trusted again (frame_guard.py)."""
SNAPSHOT_APPLIED = "snapshot_applied"
"""A snapshot replaced what the source said before (tracker.py)."""
SNAPSHOT_FAILED = "snapshot_failed"
"""A snapshot request failed: timed out, or the source has no snapshots (tracker.py)."""
UNRECOVERED = "unrecovered"
"""Batches were lost that neither a replay nor a snapshot could restore (tracker.py)."""
REFUSED = "refused"
"""The publisher refused our ZeroMQ handshake: a private (CURVE) stream we hold no key for, or not the key
it admits (feed.py). Nothing will arrive; it is no bad frame of the source's."""


class SourceHealth:
    """Bad-frame bookkeeping of one source (see the module doc). Owned by the I/O thread."""

    __slots__ = ("threshold", "window_s", "probation_s", "_bad", "degraded", "reason", "resynced")

    def __init__(self, threshold: int, window_s: float, probation_s: float) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self.probation_s = probation_s
        self._bad: deque[float] = deque(maxlen=threshold)
        self.degraded = False
        self.reason = ""
        """Why the source was degraded (the last bad frame's description)."""
        self.resynced = False
        """A snapshot was applied since the source was degraded."""

    def record_bad(self, now: float, what: str) -> bool:
        """Count one bad frame at ``now``; True when this one degrades the source."""
        self._bad.append(now)
        if self.degraded or len(self._bad) < self.threshold or now - self._bad[0] > self.window_s:
            return False
        self.degraded, self.resynced = True, False
        self.reason = f"{self.threshold} bad frames within {self.window_s:g}s (last: {what})"
        return True

    def may_recover(self, now: float, has_snapshots: bool) -> bool:
        """A degraded source may be trusted again (see the module picture)."""
        if not self.degraded:
            return False
        quiet = now - self._bad[-1] if self._bad else float("inf")
        if has_snapshots:
            return self.resynced and quiet > self.probation_s
        return quiet > self.window_s

    def recover(self) -> bool:
        """Trust the source again (after a resync); True if it was degraded."""
        was = self.degraded
        self.degraded, self.reason, self.resynced = False, "", False
        self._bad.clear()
        return was
