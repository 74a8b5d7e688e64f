"""Session affinity: a conversation's requests stay on the replica that served its last turn.

The pin is soft. ``KVRouter.route`` asks the policy where the request should go; when the
session's replica is another one, the policy's ``keeps_session`` decides with the same cost that
balances load (``cache_aware``: keep it unless it costs more than ``session_slack_tokens`` over
the cheapest replica), so a saturated replica releases its sessions. A pin expires ``ttl_s``
seconds after the session's last request; the table holds at most ``max_sessions`` pins and drops
the least recently used first. A session whose replica left the candidates (unhealthy, excluded)
is routed as if it had no id and re-pinned wherever it goes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvmesh.router.replicas.replica import Replica, ReplicaId


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How long and how many session pins the router keeps (``RouterConfig.sessions``; ``ttl_s`` is
    ``--session-ttl-s``)."""

    ttl_s: float = 600.0
    """Seconds a session (``x-session-id`` header or the body's ``user``) stays pinned to its replica."""
    max_sessions: int = 100_000
    """Most pins held; the least recently used is dropped beyond it."""

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"session ttl_s must be > 0 seconds, got {self.ttl_s}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")


class SessionTable:
    """session id -> (replica id, expiry), in least-recently-used order. Not thread-safe: the
    router calls it under its lock."""

    def __init__(self, config: SessionConfig | None = None) -> None:
        self.config = config or SessionConfig()
        self._pins: OrderedDict[str, tuple[ReplicaId, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pins)

    def get(self, session_id: str, now: float) -> ReplicaId | None:
        """The session's replica, or None when it has no live pin."""
        pin = self._pins.get(session_id)
        if pin is None:
            return None
        if pin[1] <= now:
            del self._pins[session_id]
            return None
        return pin[0]

    def pin(self, session_id: str, replica_id: ReplicaId, now: float) -> None:
        """Record that the session's latest request went to ``replica_id`` (refreshes the TTL)."""
        pins = self._pins
        pins[session_id] = (replica_id, now + self.config.ttl_s)
        pins.move_to_end(session_id)
        while len(pins) > self.config.max_sessions:
            pins.popitem(last=False)
        self._expire_oldest(now)

    def forget_replica(self, replica: Replica) -> int:
        """Drop every pin to ``replica`` (it was removed or lost its cache); returns how many."""
        rid = replica.id
        gone = [s for s, (r, _) in self._pins.items() if r == rid]
        for s in gone:
            del self._pins[s]
        return len(gone)

    def _expire_oldest(self, now: float) -> None:
        # Pins are refreshed in LRU order, so expired ones gather at the front: drop a few per call.
        pins = self._pins
        for _ in range(2):
            if not pins:
                return
            sid, (_, expiry) = next(iter(pins.items()))
            if expiry > now:
                return
            del pins[sid]
