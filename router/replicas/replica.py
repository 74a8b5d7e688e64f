"""One replica as the router knows it: a single record (``Replica``) that every part of the router reads and writes.

The classes that act on a replica (load tracking, passive health, outliers, models, receipts, the event intake,
admission) keep their logic and read or write these fields, not maps keyed by its id, so forgetting a replica is
dropping its record (router/replicas/replica_set.py):

    spec, role, state       where it listens, what it does (prefill, decode, both), joining / ready / draining
    healthy                 in rotation now (answers /health, not ejected, not draining)
    degraded                why its cache information is not trusted, per cause (routed by load only)
    load                    its load: the router's counters and its last /load (``ReplicaLoad``)
    health, patience        passive health: failures, ejections, progress, the deadlines of its answers
    served                  the base model and adapters it serves (its /v1/models and /load)
    accepts                 what it takes instead of text (token ids; its /server_info)
    reuse                   reuse totals of the requests routed to it (its route receipts)
    stream                  its event stream as the router watches and feeds it
    learned_slots           what admission learned of the requests it runs at once
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvmesh.router.replicas.health import ReplicaHealth
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.reuse import ReuseTotals
from kvmesh.router.replicas.stream import StreamState

if TYPE_CHECKING:
    from kvmesh.router.replicas.served import ServedModels

ReplicaId = str
"""A replica's id: ``ReplicaSpec.replica_id`` (its URL unless named), in the simulator ``str`` of its index."""

JOINING, READY, DRAINING = "joining", "ready", "draining"
"""A replica's lifecycle: registered but not yet healthy once; healthy at least once; getting no new requests."""
INCOMPATIBLE, BAD_FRAMES, STALLED, LAGGING, LOST_EVENTS = (
    "incompatible", "bad_frames", "stalled", "lagging", "lost_events")
DEGRADED_CAUSES = (INCOMPATIBLE, BAD_FRAMES, STALLED, LAGGING, LOST_EVENTS)
"""Why a replica may be degraded: its blocks cannot match the router's keys (block size, tokenizer);
its stream sends bad frames; it stopped (published batches not applied); it lags (batches applied
long after they happened); it lost batches that neither replay nor a snapshot restored."""

PREFILL = "prefill"
"""The role of a replica that prefills for others and never decodes (router/routing/roles.py)."""


@dataclass(slots=True, eq=False)
class Replica:
    """See the module doc."""

    id: ReplicaId
    role: str = "both"
    """``prefill``, ``decode`` or ``both`` (router/routing/roles.py)."""
    spec: Any = None
    """Where it listens: its ``ReplicaSpec`` (router/config.py, which builds the router: not imported here); None: a
    replica known by id only, e.g. the simulator's."""
    state: str = JOINING
    """``JOINING``, ``READY`` or ``DRAINING``."""
    healthy: bool = False
    """It may receive requests now."""
    degraded: dict[str, str] = field(default_factory=dict)
    """Cause (one of ``DEGRADED_CAUSES``) -> reason, for each cause that holds."""
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    health: ReplicaHealth = field(default_factory=ReplicaHealth)
    patience: Any = None
    """The deadlines of its answers (router/replicas/patience.py's ``Patience``); None until first asked for."""
    progress_mark: tuple[int, int, int, float] | None = None
    """At its last ``/load`` poll: (its KV event seq, its prefill queue, the router's last applied seq, when)."""
    probe_trial: Any = None
    """Its probe request in flight while ejected (an ``asyncio.Task``); None: none."""
    served: ServedModels | None = None
    """What it reported serving (None: not yet)."""
    adapters_asked: frozenset | None = None
    """The adapter names its ``/v1/models`` was last read for."""
    accepts: str | None = None
    """What it takes instead of text (router/http/token_forwarding.py's ``UpstreamKind``), from ``/server_info``;
    None: not said yet (text)."""
    reuse: ReuseTotals = field(default_factory=ReuseTotals)
    stream: StreamState = field(default_factory=StreamState)
    learned_slots: Any = None
    """What admission learned of its slots (router/admission/room.py's ``LearnedSlots``, which this room may not
    import; the admission gate sets it); None: nothing yet."""

    @property
    def prefill_only(self) -> bool:
        """Of role prefill: it prefills for others, never decodes a request."""
        return self.role == PREFILL

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
