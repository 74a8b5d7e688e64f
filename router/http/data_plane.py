"""``DataPlane``: what the data plane (the proxy, its relay, KV handoff, request reader and accounting) works with, as
one object of concrete parts that the running router (router/control/runtime.py) assembles:

    config, router, renderer, tenants    the router's settings, its decision core (router/routing/), its front end
    metrics, receipt_metrics             what the data plane counts
    failures                             what an answer says of its replica (failures.py): counts, ejections, deadlines
    admission                            the router's queue and limits (admission_gate.py); None: off
    pool, headers                        the connections to the replicas (upstream.py) and their credentials
    pool_for, frontend_for               the control room's model pools: a request's pool, its tokenizer and renderer
    ensure_adapter                       the control room's adapter loads: the pool's adapter on a replica

The last three are functions of the control room (router/control/models.py, adapter_loads.py), which the data
plane never imports; a request reaches a replica's record (``Replica``), never its id, through all of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.replica.openai.renderer import PromptRenderer
    from kvmesh.replica.serving.tokenizer import Tokenizer
    from kvmesh.router.admission.tenants import Tenants
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.http.admission_gate import AdmissionGate
    from kvmesh.router.http.failures import ReplicaFailures
    from kvmesh.router.http.metrics import RouterMetrics
    from kvmesh.router.http.receipt_metrics import ReceiptMetrics
    from kvmesh.router.http.upstream import UpstreamPool
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter
    from kvmesh.router.routing.model_pools import ModelPool


@dataclass(eq=False, slots=True)
class DataPlane:
    """See the module doc."""

    config: RouterConfig
    router: KVRouter
    renderer: PromptRenderer
    """Renders requests to token ids off the event loop, as the replicas do (the router's own model)."""
    tenants: Tenants
    """API key or ``user`` -> tenant (router/admission/tenants.py)."""
    metrics: RouterMetrics
    receipt_metrics: ReceiptMetrics
    failures: ReplicaFailures
    """Counts a replica's failed answers, ejects it, holds the deadlines of its answers (failures.py)."""
    admission: AdmissionGate | None
    """The router's queue, limits and 429s; None: every request goes on."""
    headers: dict[str, str]
    """Credentials of every call to a replica: the cluster's internal key, else ``upstream.replica_api_key``."""
    pool_for: Callable[[str | None], ModelPool | None]
    """The replicas a request's ``"model"`` may go to (None: all); ProtocolError 400/404 for none."""
    frontend_for: Callable[[ModelPool | None], tuple[Tokenizer | None, PromptRenderer]]
    """The tokenizer and renderer of the pool's base model."""
    ensure_adapter: Callable[[Replica, ModelPool | None], Awaitable[None]]
    """Load the pool's adapter on the replica when it lacks it (AdapterLoadError: it did not load)."""
    pool: UpstreamPool | None = None
    """Keep-alive connections to the replicas carrying the proxied requests (None until the router starts)."""
    turn: Callable[[], Awaitable[None]] | None = None
    """Waits for this router's turn to decide among the service's routers before a request is routed
    (``RouterSync.take_turn``, router/control/turns.py); None: routed at once."""
