"""The peer pulls still landing on each replica, by their priced seconds, counted on its load
(``ReplicaLoad.landing_pulls``) for the default policy to price.

A pulled request joins its replica's queue only once its transfer ends: a request sent to that replica meanwhile
starts first, and the pulled one waits through its prefill on a replica the router priced as starting it at once
(router/routing/cost/stored_tokens.py prices that delay).

    landing = PullsLanding()                 one per router, under its lock
    landing.add(replica, pull, now)          a committed decision with a pull
    landing.count(now)                       before a decision: each replica's ``landing_pulls`` at ``now``
    landing.release(replica, pull)           its attempt ended unanswered (failed, cancelled): it will not land

``now`` is the router's clock (``time.monotonic()`` when None; the simulator passes simulated time).
"""

from __future__ import annotations

import time

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.kv_placement import PlannedPull


class PullsLanding:
    """See the module doc."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[Replica, list[tuple[float, PlannedPull]]] = {}
        """Replica -> when each pull planned to it lands, by its price, and the pull."""

    def __bool__(self) -> bool:
        return bool(self._until)

    def add(self, replica: Replica, pull: PlannedPull, now: float | None) -> None:
        """``pull``, committed to ``replica`` at ``now``: it lands after its priced seconds."""
        if replica.removed:
            return
        self._until.setdefault(replica, []).append(((time.monotonic() if now is None else now) + pull.pull_s, pull))
        replica.load.landing_pulls = len(self._until[replica])

    def release(self, replica: Replica, pull: PlannedPull) -> None:
        """``pull`` will not land on ``replica`` (its attempt failed or was cancelled before an answer)."""
        landing = self._until.get(replica, [])
        left = [entry for entry in landing if entry[1] is not pull]
        if len(left) == len(landing):
            return
        if left:
            self._until[replica] = left
        else:
            del self._until[replica]
        replica.load.landing_pulls = len(left)

    def count(self, now: float | None) -> None:
        """Set each replica's ``landing_pulls`` to the pulls still landing there at ``now``; forget the landed."""
        t = time.monotonic() if now is None else now
        for replica in list(self._until):
            left = [entry for entry in self._until[replica] if entry[0] > t]
            if len(left) != replica.load.landing_pulls:
                replica.load.landing_pulls = len(left)
            if left and not replica.removed:
                self._until[replica] = left
            else:
                del self._until[replica]
