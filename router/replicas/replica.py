"""One replica as the router knows it: a single record (``Replica``) that every part of the router reads and writes.

The classes that act on a replica (load tracking, passive health, outliers, models, receipts, the event intake,
admission) keep their logic and read or write these fields, not maps keyed by its id, so forgetting a replica is
dropping its record (router/replicas/replica_set.py):

    spec, role, state       where it listens, what it does (prefill, decode, both), joining / ready / draining
    advertised_from         the spec as given, when its event endpoints came from its /server_info
    removed                 dropped from the set while a request still held it
    healthy                 in rotation now (answers /health, not ejected, not draining)
    degraded                why its cache information is not trusted, per cause (routed by load only)
    load                    its load: the router's counters and its last /load (``ReplicaLoad``)
    kv_layout               what its KV is (model, dtype, block size, FP8 scales' digest, attention layout, TP size,
                            transport: its /load's kv_transfer.layout, kept on ``load``); who may share KV with it
                            (router/replicas/kv_share.py)
    health, patience        passive health: failures, ejections, progress, the deadlines of its answers
    served                  the base model and adapters it serves (its /v1/models and /load)
    accepts                 what it takes instead of text (token ids; its /server_info)
    salt_keys_match         whether the router keys salted prompts as it hashes them (its /server_info)
    kv_peers_pending        this router's replica set did not reach it yet: no pull is planned to it
    reuse                   reuse totals of the requests routed to it (its route receipts)
    stream                  its event stream as the router watches and feeds it
    learned_slots           what admission learned of the requests it runs at once
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from kvmesh.router.replicas.health import ReplicaHealth
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.patience import Patience
from kvmesh.router.replicas.reuse import ReuseTotals
from kvmesh.router.replicas.roles import PREFILL, ReplicaRole
from kvmesh.router.replicas.spec import ReplicaSpec
from kvmesh.router.replicas.stream import StreamState
from kvmesh.router.replicas.wire_enum import WireEnum

if TYPE_CHECKING:
    import asyncio

    from kvmesh.replica.serving.load_report import KVLayoutInfo
    from kvmesh.router.admission.room import LearnedSlots
    from kvmesh.router.replicas.served import ServedModels

ReplicaId = str
"""A replica's id: ``ReplicaSpec.replica_id`` (its URL unless named), in the simulator ``str`` of its index."""


class ReplicaState(WireEnum):
    """A replica's lifecycle: registered but not yet healthy once; healthy at least once; getting no new requests."""

    JOINING = "joining"
    READY = "ready"
    DRAINING = "draining"


JOINING, READY, DRAINING = ReplicaState.JOINING, ReplicaState.READY, ReplicaState.DRAINING


class DegradedCause(WireEnum):
    """Why a replica may be degraded: its blocks cannot match the router's keys (block size, tokenizer); its
    stream sends bad frames; it stopped (published batches not applied); it lags (batches applied long after
    they happened); it lost batches that neither replay nor a snapshot restored."""

    INCOMPATIBLE = "incompatible"
    BAD_FRAMES = "bad_frames"
    STALLED = "stalled"
    LAGGING = "lagging"
    LOST_EVENTS = "lost_events"


INCOMPATIBLE, BAD_FRAMES, STALLED, LAGGING, LOST_EVENTS = (
    DegradedCause.INCOMPATIBLE, DegradedCause.BAD_FRAMES, DegradedCause.STALLED, DegradedCause.LAGGING,
    DegradedCause.LOST_EVENTS)
DEGRADED_CAUSES = tuple(DegradedCause)

UpstreamKind = Literal["kvmesh", "vllm", "text"]
"""What a replica accepts instead of text (one of the three below; router/http/token_forwarding.py)."""
KVMESH: UpstreamKind = "kvmesh"
"""A kvmesh replica with the router's tokenizer and chat template: completions and chat carry token ids."""
VLLM: UpstreamKind = "vllm"
"""An upstream that does not say it is kvmesh (vLLM): completions carry token ids, chat goes as sent."""
TEXT: UpstreamKind = "text"
"""An upstream whose ids may differ from the router's (tokenizer fingerprint mismatch): bodies go as sent."""


@dataclass(slots=True, eq=False)
class Replica:
    """See the module doc."""

    id: ReplicaId
    role: ReplicaRole = ReplicaRole.BOTH
    """Prefill, decode or both (router/replicas/roles.py)."""
    spec: ReplicaSpec | None = None
    """Where it listens; None: a replica known by id only, e.g. the simulator's."""
    state: ReplicaState = ReplicaState.JOINING
    healthy: bool = False
    """It may receive requests now."""
    degraded: dict[DegradedCause, str] = field(default_factory=dict)
    """Cause -> reason, for each cause that holds."""
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    health: ReplicaHealth = field(default_factory=ReplicaHealth)
    patience: Patience | None = None
    """The deadlines of its answers; None until first asked for (router/control/passive_health.py)."""
    progress_mark: tuple[int, int, int, float] | None = None
    """At its last ``/load`` poll: (its KV event seq, its prefill queue, the router's last applied seq, when)."""
    probe_trial: asyncio.Task[None] | None = None
    """Its probe request in flight while ejected; None: none."""
    served: ServedModels | None = None
    """What it reported serving (None: not yet)."""
    adapters_asked: frozenset[str] | None = None
    """The adapter names its ``/v1/models`` was last read for."""
    accepts: UpstreamKind | None = None
    """What it takes instead of text, from ``/server_info``; None: not said yet (text)."""
    salt_keys_match: bool | None = None
    """Whether its salt secret is the router's (``/server_info``'s ``salt_secret_check``): False, a request with a
    ``cache_salt`` matches none of its blocks; None: not said (vLLM) or not asked yet."""
    reuse: ReuseTotals = field(default_factory=ReuseTotals)
    stream: StreamState = field(default_factory=StreamState)
    kv_peers_pending: bool = False
    """This router's last ``POST /kv/peers`` to it failed (router/control/kv_peers.py retries it): it may lack the
    replica set, and a replica skips a pull from a peer it does not know, so no pull is planned to it meanwhile."""
    removed: bool = False
    """Dropped from the set (``ReplicaSet.remove``): a request that still holds the record counts nothing on it."""
    learned_slots: LearnedSlots | None = None
    """What admission learned of its slots (router/admission/room.py, named for its type only; the admission gate
    sets it); None: nothing yet."""
    advertised_from: ReplicaSpec | None = None
    """The spec it was registered with, without event endpoints, when ``spec``'s came from its ``/server_info``
    (router/control/event_discovery.py); None: ``spec`` is as given."""

    @property
    def prefill_only(self) -> bool:
        """Of role prefill: it prefills for others, never decodes a request."""
        return self.role == PREFILL

    @property
    def events_source(self) -> str:
        """Where its event endpoints came from: "given" (its spec), "advertised" (its /server_info), or "none"
        (routed without its events: by load and the router's own short-lived predictions)."""
        if self.advertised_from is not None:
            return "advertised"
        return "given" if self.spec is not None and self.spec.events else "none"

    @property
    def kv_layout(self) -> KVLayoutInfo | None:
        """What its KV is, as its ``/load`` says (``ReplicaLoad.kv_layout``): KV moves only between equal ones."""
        return self.load.kv_layout

    @property
    def draining(self) -> bool:
        return self.state == DRAINING

    @property
    def degraded_reason(self) -> str | None:
        """Its causes' reasons joined; None: its cache information is trusted."""
        return "; ".join(self.degraded.values()) if self.degraded else None

    @property
    def routable(self) -> bool:
        """A decode candidate now: healthy and not of role prefill."""
        return self.healthy and self.role != PREFILL
