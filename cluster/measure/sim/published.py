"""Simulated replicas that publish their load (``SimConfig.published_loads``), as a kvmesh replica does on its
event stream (events/load.py): at once when it accepts a request, and after an engine step that changed its load
(at most every ``load_publish_interval_s``), the replica's running and waiting
requests, queued prefill tokens, KV usage, prefill rate, and per router the highest booking number it accepted
(router/replicas/bookings.py). Every router takes the update ``load_publish_lag_s`` later
(``LoadTracker.apply_published``) and adds only its own bookings the replica had not accepted then: no router
shares memory with another, and each sees a replica's load as of its last step end plus the lag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.events.publish.load_ledger import LoadLedger

if TYPE_CHECKING:
    from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
    from kvmesh.events.load import ReplicaLoadUpdate


class SimLoadPublishing:
    """What each replica accepted per router, and the update it publishes when a step ends."""

    def __init__(self) -> None:
        self.ledgers: dict[str, LoadLedger] = {}
        """Replica id -> what it counts of the requests it accepted."""
        self._last: dict[str, tuple] = {}
        self._published_at: dict[str, float] = {}
        self._due: set[str] = set()
        self.published = 0
        """Updates published (all replicas)."""

    def ledger(self, replica_id: str) -> LoadLedger:
        ledger = self.ledgers.get(replica_id)
        if ledger is None:
            ledger = self.ledgers[replica_id] = LoadLedger()
        return ledger

    def accept(self, replica_id: str, req: SimRequest, now: float) -> None:
        """``req`` joined ``replica_id``'s queue at ``now``: its router's booking is counted there from now on."""
        self.ledger(replica_id).accept(req.booking, req.num_prompt_tokens, _uncached(req), now)

    def wait(self, replica_id: str, now: float, interval_s: float, due: bool, accepted: bool = False) -> float | None:
        """Seconds until ``replica_id`` may publish a change made at ``now`` (0: now; None: an update is already
        due then). ``due``: the wait asked for before is over; ``accepted``: the change is a request it accepted,
        published at once whatever the interval, which counts only the updates its steps caused (the routers that
        did not send it must see it before they choose)."""
        if due:
            self._due.discard(replica_id)
        elif replica_id in self._due and not accepted:
            return None
        if accepted:  # not counted against the interval, which caps the steps' updates
            return 0.0
        wait = self._published_at.get(replica_id, -interval_s) + interval_s - now
        if wait > 1e-12:
            self._due.add(replica_id)
            return wait
        self._published_at[replica_id] = now
        return 0.0

    def update(self, rep: SimReplica, now: float, steps: int, force: bool = False) -> ReplicaLoadUpdate | None:
        """The load ``rep`` publishes at ``now`` (simulated seconds, its ``ts``) after ``steps`` steps (None: unchanged
        since its last update, unless ``force``)."""
        report = rep.load_report()
        ledger = self.ledger(rep.replica_id)
        queued = sum(_uncached(r) for r in (*rep.waiting, *rep.running))
        key = (report.num_requests_running, report.num_requests_waiting, queued, sum(ledger.accepted.values()))
        if not force and self._last.get(rep.replica_id) == key:
            return None
        self._last[rep.replica_id] = key
        self.published += 1
        return ledger.update(now, now, report.num_requests_running, report.num_requests_waiting, queued,
                             report.kv_cache_usage, report.prefill_tokens_per_s, engine_steps=steps)


def _uncached(req: SimRequest) -> int:
    """Prompt tokens ``req`` has yet to compute on its replica: a request not scheduled yet counts its prompt less
    the prefix its router predicted cached there (the booking's uncached tokens), as a kvmesh replica counts it."""
    return max(0, req.num_prompt_tokens - max(req.num_computed_tokens, req.predicted_hit_tokens))
