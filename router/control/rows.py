"""``GET /replicas``: one row per replica, the msgspec Structs read by serve's workers, the CLI and the autoscaler."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica


class ReplicaRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One replica as the router sees it (every field is sent but ``exclusive_blocks``, which only
    ``?drain_cost=true`` computes, and the passive-health fields while they hold their defaults)."""

    id: str
    """The replica id (``ReplicaSpec.replica_id``)."""
    url: str
    """Its OpenAI HTTP server."""
    role: str
    """``prefill``, ``decode`` or ``both`` (router/replicas/roles.py)."""
    events: str | None
    """Its KV event stream (ZeroMQ PUB endpoint); None: routed by load only."""
    replay: str | None
    """Its replay/snapshot endpoint; None: gaps are not recovered."""
    events_source: str
    """Where ``events`` came from: ``given`` (its --replica spec or registration), ``advertised`` (its
    ``/server_info``), ``none`` (routed without its events: by load only)."""
    healthy: bool
    """It answers ``/health`` and gets requests."""
    draining: bool
    """Out of rotation: its running requests finish, then it is removed."""
    degraded: str | None
    """Why its cache information is not trusted (routed by load only); None: trusted."""
    in_flight: int
    """Requests all router processes of this host sent it that have not finished."""
    prefill_backlog: int
    """Prompt tokens it must prefill before a new request's own prefill starts (``ReplicaLoad``)."""
    ejected: bool = False
    """Out of rotation after a sick answer or failures in a row (router/routing/outlier.py) until a probe request
    is answered."""
    ejected_for_s: float = 0.0
    """Seconds left of that ejection's back-off (0 while ``ejected``: waiting for its probe request)."""
    ejections: int = 0
    """Times it was ejected."""
    last_failure: str | None = None
    """What its last failed answer was (None: none yet)."""
    running: int = 0
    """Requests the replica itself reports running or waiting (its ``/load`` as of the last poll): every router's,
    those of routers on other hosts included."""
    exclusive_blocks: int | None = None
    """Blocks of the index only this replica holds: what draining it would cost (only when asked for)."""
    model: str | None = None
    """The base model it serves (its ``/v1/models``; router/control/models.py); None: not reported (yet)."""
    adapters: list[str] = msgspec.field(default_factory=list)
    """The LoRA adapters it has (its ``/v1/models`` and ``/load``)."""
    decode_load: int = 0
    """Requests sharing its decode steps as this router sees them (``ReplicaLoad.decode_load``)."""
    salt_keys_match: bool | None = None
    """Whether this router keys salted prompts as it hashes them (the same salt secret, its ``/server_info``);
    False: requests with a ``cache_salt`` get no prefix matches on it; None: it does not say (vLLM)."""
    load_seq: int | None = None
    """``seq`` of the last load it published that this router applied (events/load.py); None: none (its ``/load``
    polls count)."""


class ReplicaList(msgspec.Struct):
    """The body of ``GET /replicas``."""

    replicas: list[ReplicaRow]
    waiting: int = 0
    """Requests the router's admission holds that no replica has yet (router/admission/; those of every router
    process of the host): load the rows' ``in_flight`` does not show, which the autoscaler counts with it."""

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def decode(raw: bytes) -> ReplicaList:
        """Raises ``msgspec.ValidationError`` (a ``ValueError``) for a body that is not a replica list."""
        return msgspec.json.decode(raw, type=ReplicaList)


def replica_row(replica: Replica, now: float) -> ReplicaRow:
    """``replica``'s row, all of it from its record (``now``: the monotonic clock its ejection is timed by)."""
    spec, health, load, served = replica.spec, replica.health, replica.load, replica.served
    ejected_until = health.ejected_until
    return ReplicaRow(id=replica.id, url=spec.url, role=spec.role, events=spec.events, replay=spec.replay,
                      events_source=replica.events_source,
                      healthy=replica.healthy, draining=replica.draining, degraded=replica.degraded_reason,
                      in_flight=load.total_in_flight, prefill_backlog=load.prefill_backlog,
                      running=load.num_running + load.num_waiting,
                      ejected=ejected_until is not None,
                      ejected_for_s=round(max(0.0, ejected_until - now) if ejected_until is not None else 0.0, 1),
                      ejections=health.ejections, last_failure=health.last_failure,
                      model=served.base if served is not None else None,
                      adapters=sorted(served.adapters) if served is not None else [],
                      decode_load=load.decode_load, load_seq=load.published_seq,
                      salt_keys_match=replica.salt_keys_match)
