"""Passive health: which replicas are out of rotation because their answers failed (Envoy's outlier detection).

Every proxied request tells the detector how its replica did: the first bytes arrived (``on_success``), or it
failed (``on_failure``: a refused or reset connection, a 5xx, no first byte or a stalled stream within the
router's deadlines while the replica showed no progress, an answer that is not JSON or SSE). Any sign that a
replica is working -- bytes of any answer, its ``/load`` prefill queue shrinking or its KV event seq moving --
is ``on_progress``; the HTTP layer waits longer for a replica that progresses (``progressed_since``) and does
not hold a missed deadline against it.

    a sick answer (a missed deadline without progress, not JSON or SSE)  ->  ejected until a probe request is
                                                                            answered (its /health cannot tell)
    consecutive failures >= threshold  ->  ejected for base * 2^k s (k: its earlier ejections, capped at max)
    ejection over                      ->  one probe request (a 1-token completion; router/control/probes.py)
    probe answered                     ->  back in rotation; a probe that fails ejects it again, for longer

A replica whose ``/health`` fails is down, not an outlier (``on_down``): its count starts over and an
ejection is lifted, so a replica that Ray restarts is back as soon as it answers ``/health``. ``k`` drops back to 0 once
a re-admitted replica has served ``max_ejection_s`` without another ejection. The
caller never ejects the last replica in rotation (Envoy's ``max_ejection_percent``, here: one stays). Pure
bookkeeping on the router's event loop over each replica record's ``health``: no I/O, no locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvmesh.router.replicas.health import ReplicaHealth
from kvmesh.router.replicas.replica import Replica

__all__ = ["OutlierConfig", "OutlierDetector"]


@dataclass(frozen=True, slots=True)
class OutlierConfig:
    """When a replica leaves rotation and for how long (``RouterConfig.outliers``; flags ``--outlier-*``)."""

    consecutive_failures: int = 3
    """Consecutive failures of a replica (refused or reset connections, 5xx, missed deadlines without progress,
    answers that are not JSON or SSE) that eject it from rotation, as Envoy's outlier detection; 0: never eject.
    The last replica in rotation is never ejected."""
    base_ejection_s: float = 30.0
    """Seconds a replica's first ejection lasts; each further one doubles it (up to outlier_max_ejection_s). When
    it ends, a probe request (a one-token completion) must be answered before the replica gets traffic again."""
    max_ejection_s: float = 300.0
    """Longest ejection; a re-admitted replica that serves this long without another ejection starts over at
    outlier_base_ejection_s."""

    def __post_init__(self) -> None:
        if self.consecutive_failures < 0:
            raise ValueError("outlier_consecutive_failures must be >= 0 (0 = never eject), got "
                             f"{self.consecutive_failures}")
        if not 0 < self.base_ejection_s <= self.max_ejection_s:
            raise ValueError("outlier ejections must last 0 < outlier_base_ejection_s <= outlier_max_ejection_s, "
                             f"got {self.base_ejection_s} and {self.max_ejection_s}")


class OutlierDetector:
    """Failure counts and ejections, kept on each replica's record (``Replica.health``; see the module doc)."""

    def __init__(self, config: OutlierConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = config.consecutive_failures
        """Consecutive failures that eject a replica; 0: never eject."""
        self.base_ejection_s = config.base_ejection_s
        self.max_ejection_s = config.max_ejection_s
        self.clock = clock

    # ---------------------------------------------------------------- what requests and probes saw
    def on_progress(self, replica: Replica, at: float | None = None) -> None:
        """The replica made progress at monotonic time ``at`` (now if None); a poll that sees a change since the
        last one passes the last one's time: all it knows is that the change came after it."""
        h = replica.health
        h.last_progress = max(h.last_progress, self.clock() if at is None else at)

    @staticmethod
    def progressed_since(replica: Replica, since: float) -> bool:
        """Whether the replica showed progress after monotonic time ``since``."""
        return replica.health.last_progress > since

    def on_success(self, replica: Replica) -> None:
        """An answer from the replica arrived."""
        h = replica.health
        h.consecutive_failures = 0
        h.last_progress = now = self.clock()
        if h.level and h.ejected_until is None and now - h.readmitted_at > self.max_ejection_s:
            h.level = 0

    def on_failure(self, replica: Replica, why: str, can_eject: bool, sick: bool = False) -> float | None:
        """Count a failure; the seconds of the ejection it caused (0: until a probe request is answered), or
        None (``can_eject``: another replica stays in rotation; ``sick``: an answer that ``/health`` cannot
        vouch for, which ejects at once)."""
        h = replica.health
        h.consecutive_failures += 1
        h.last_failure = why
        if not can_eject or not self.threshold or h.ejected_until is not None:
            return None
        if h.consecutive_failures >= self.threshold:
            return self._eject(h)
        if sick:
            h.ejected_until = self.clock()
            h.ejections += 1
            return 0.0
        return None

    def _eject(self, h: ReplicaHealth) -> float:
        seconds = min(self.base_ejection_s * 2 ** h.level, self.max_ejection_s)
        h.ejected_until = self.clock() + seconds
        h.ejections += 1
        h.level += 1
        return seconds

    @staticmethod
    def on_down(replica: Replica) -> None:
        """Its ``/health`` failed: the process is down (killed, restarting), which explains its failures, and a
        restarted one is vouched for by ``/health`` again -- no ejection to wait out, the count starts over."""
        h = replica.health
        h.consecutive_failures = 0
        h.ejected_until = None

    # ---------------------------------------------------------------- ejections
    @staticmethod
    def is_ejected(replica: Replica) -> bool:
        """Out of rotation: ejected, and not yet re-admitted by a probe request."""
        return replica.health.ejected_until is not None

    def ejected_for_s(self, replica: Replica) -> float:
        """Seconds left of its ejection (0: in rotation, or over and waiting for its probe request)."""
        until = replica.health.ejected_until
        return 0.0 if until is None else max(0.0, until - self.clock())

    def probe_due(self, replica: Replica) -> bool:
        """Ejected, and its ejection is over: a probe request decides whether it comes back."""
        until = replica.health.ejected_until
        return until is not None and until <= self.clock()

    def on_probe(self, replica: Replica, answered: bool, why: str = "") -> float | None:
        """The probe request's outcome: re-admitted (None), or ejected again for the seconds returned."""
        h = replica.health
        if answered:
            h.ejected_until = None
            h.consecutive_failures = 0
            h.readmitted_at = h.last_progress = self.clock()
            return None
        h.last_failure = why
        return self._eject(h)
