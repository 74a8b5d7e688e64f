"""What the replicas report of themselves, taken in by the router: their KV events (into the prefix index, the
eviction counts and ghosts), their health and their degraded causes (``KVRouter``'s part that the event feed,
the probes and passive health drive; router/control/). An event batch names its publisher by id: the one place a
decision's state is reached by a replica's id. Event batches arrive on the subscriber's thread, so each change
takes the router's lock.
"""

from __future__ import annotations

import threading

from kvmesh.events.schema import EventBatch
from kvmesh.router.replicas.replica import DEGRADED_CAUSES, JOINING, READY, DegradedCause, Replica, ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.routing.evicting import apply_evictions
from kvmesh.router.routing.eviction_ghosts import EvictionGhosts
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.session import SessionTable


class EventIntake:
    """``KVRouter``'s intake of what its replicas report (the router holds the state it writes)."""

    lock: threading.Lock
    replicas: ReplicaSet
    index: PrefixIndex
    sessions: SessionTable
    ghosts: EvictionGhosts | None
    untrusted: set[Replica]
    """The degraded replicas (``set_degraded``): their index matches are ignored."""
    events_applied: int
    """Events applied from all replicas."""

    def _removed(self, replica: Replica) -> None:
        self.untrusted.discard(replica)
        self.index.remove_replica(replica.id)
        self.sessions.forget_replica(replica)
        if self.ghosts is not None:
            self.ghosts.forget(replica.load)

    @property
    def healthy(self) -> frozenset[ReplicaId]:
        """Replicas that may receive requests (read from the records)."""
        return self.replicas.healthy_ids()

    @property
    def degraded(self) -> dict[ReplicaId, str]:
        """Replica id -> why its cache information is not trusted (its causes' reasons joined); such replicas are
        routed by load only (read from the records)."""
        return {r.id: r.degraded_reason for r in self.replicas.records() if r.degraded}

    def set_healthy(self, replica: Replica, healthy: bool, clear_cache: bool = False) -> None:
        """Mark a replica (un)healthy, a draining one never; ``clear_cache`` drops its tree (it died and lost its
        cache)."""
        with self.lock:
            if replica.removed:
                return
            replica.healthy = healthy and not replica.draining  # a probe from before its drain may end after it
            if healthy and replica.state == JOINING:
                replica.state = READY
            self.replicas.changed()
            if clear_cache:
                self.index.clear_replica(replica.id)
                self.sessions.forget_replica(replica)

    def clear_cache(self, replica: Replica) -> None:
        """Forget which blocks a replica holds (its tree, real and predicted); it keeps its sessions."""
        with self.lock:
            if not replica.removed:
                self.index.clear_replica(replica.id)

    def set_degraded(self, replica: Replica, reason: str | None,
                     cause: DegradedCause = DegradedCause.INCOMPATIBLE) -> None:
        """Mark a replica degraded for ``cause`` (``reason``: why its cache information is not trusted,
        e.g. a block size mismatch, a stalled event stream) or clear that cause (None). The replica is
        degraded while any cause holds: it still receives requests, chosen by load only (its index
        matches are ignored). Causes are independent: a stream that catches up does not lift a mismatch."""
        if cause not in DEGRADED_CAUSES:
            raise ValueError(f"unknown degraded cause {cause!r}; one of {', '.join(DEGRADED_CAUSES)}")
        with self.lock:
            if replica.removed:
                return
            if reason is None:
                replica.degraded.pop(cause, None)
            else:
                replica.degraded[cause] = reason
            (self.untrusted.add if replica.degraded else self.untrusted.discard)(replica)

    def apply_events(self, replica_id: ReplicaId, batch_or_events) -> None:
        """Apply a replica's event batch (called from the subscriber's thread)."""
        events = batch_or_events.events if isinstance(batch_or_events, EventBatch) else batch_or_events
        with self.lock:
            if (replica := self.replicas.get(replica_id)) is not None:
                self.index.apply(replica_id, events)
                apply_evictions(replica.load, events)
                if self.ghosts is not None:
                    self.ghosts.apply(replica.load, events)
                self.events_applied += len(events)
