"""The running router: the replica set, and what lives as long as the door.

``RouterRuntime`` assembles the ``KVRouter`` (router/routing/, which owns the replica set: router/replicas/), the
tokenizer and renderer, the event feed (event_feed.py), the probes of every replica (probes.py), passive health,
the models and the KV peers, each given what it uses, and the router's clients to its replicas
(replica_calls.py); it listens to the set for what a replica's coming and going means outside the router's
decision (its event source, its first probe, metrics, the KV peers). Replicas can be added, re-registered with
new endpoints, drained and removed at runtime: a
draining replica gets no new requests (the health probe never puts it back) while the ones it
runs, streams included, finish; whoever drains it removes it once ``in_flight`` is 0.

A replica whose cache information cannot be trusted is *degraded*: the router routes to it by load
only (``KVRouter.set_degraded``), the other replicas are not touched. Causes: blocks that cannot
match the router's keys (``ReplicaProbes.check_compatible``); a stream that keeps sending bad frames (or batches
over ``max_source_blocks``; the subscriber's guard, until a snapshot resync -- router/control/event_feed.py,
which also stops holding such a replica's events meanwhile); a stream that stalled,
lags or lost batches (``StreamWatch``, router/control/stream_watch.py, from the events and each ``/load``).
``feed_state()`` says whether the feed's thread runs (for ``/health``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.router.config import ReplicaSpec, RouterConfig, build_router
from kvmesh.router.control.adapter_loads import AdapterLoads
from kvmesh.router.control.event_feed import EventFeed
from kvmesh.router.control.kv_peers import KVPeerRegistry
from kvmesh.router.control.metrics_state import metrics_state
from kvmesh.router.control.models import RouterModels, router_tokenizer
from kvmesh.router.control.passive_health import PassiveHealth
from kvmesh.router.control.probes import ReplicaProbes
from kvmesh.router.control.quota_sync import QuotaSync, fleet_quota
from kvmesh.router.control.replica_calls import ReplicaCalls
from kvmesh.router.control.router_sync import RouterSync
from kvmesh.router.control.stream_watch import StreamWatch
from kvmesh.router.control.sync_wire import router_key_seed
from kvmesh.router.http.admission_gate import AdmissionGate
from kvmesh.router.http.data_plane import DataPlane
from kvmesh.router.http.fleet_metrics import FleetMetrics
from kvmesh.router.http.metrics import RouterMetrics
from kvmesh.router.http.receipt_metrics import ReceiptMetrics
from kvmesh.router.replicas.replica import DRAINING, Replica

if TYPE_CHECKING:
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.events.subscribe.subscriber import EventSubscriber
    from kvmesh.replica.serving.tokenizer import Tokenizer
    from kvmesh.router.http.upstream import UpstreamPool
    from kvmesh.router.routing.kv_router import KVRouter
    from kvmesh.router.routing.model_pools import ModelPool

logger = logging.getLogger(__name__)

Json = dict[str, object]
"""A JSON object answered as it is (the fleet's state and decisions, ``/health``'s feed state)."""


class Fleet(Protocol):
    """Whoever can add and remove replica processes (``kvmesh serve``'s launcher, cluster/fleet/operations.py)."""

    target: int
    """Replicas the fleet aims for."""

    def request_remove(self, replica_id: str) -> bool:
        """Remove the replica's process once drained (False: not the fleet's); ValueError: refused."""
    def state(self) -> Json: ...
    def request_scale(self, replicas: int, role: str | None = None, deployment: str | None = None) -> Json: ...
    def request_rollout(self, engine: Json, deployment: str | None = None) -> Json: ...


class RouterRuntime:
    """See the module doc. ``start``/``stop`` run inside the server's event loop."""

    def __init__(self, config: RouterConfig, replicas: list[ReplicaSpec] | None = None,
                 tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.router: KVRouter = build_router(config, seed=router_key_seed(config.internal_key, config.sync.enabled))
        self.sync: RouterSync | None = None
        """The stream of choices between this router and the others (router_sync.py; made at start if on)."""
        self.replicas = self.router.replicas
        """One record per replica (router/replicas/): its spec, state, health, load, models, what it accepts, ..."""
        self.calls = ReplicaCalls(config)
        """The router's HTTP clients to its replicas and their credentials (replica_calls.py)."""
        self.tokenizer = tokenizer = router_tokenizer(config, tokenizer)
        """The replicas' tokenizer (replica/serving/tokenizer.py); None = route without cache awareness."""
        self.renderer = PromptRenderer(tokenizer, config.frontend)
        """Renders requests to token ids off the event loop, as the replicas do."""
        self.metrics = RouterMetrics(self.metrics_state)
        self.fleet_metrics = FleetMetrics()
        """The replicas' vllm:* series on /metrics, read when /metrics is (router/http/fleet_metrics.py)."""
        self.metrics.registry.register(self.fleet_metrics)
        self.tenants = config.admission.tenants(config.admin_key)
        """API key or ``user`` -> tenant (router/admission/tenants.py): admission's, and the keys auth takes."""
        self.admission = AdmissionGate(config.admission, self.tenants, self.router, self.metrics.registry) \
            if config.admission.enabled else None
        """The router's queue, limits and 429s (router/http/admission_gate.py); None: every request goes on."""
        self.quota: QuotaSync | None = None
        """Tenants' token buckets kept with the other routers' (control/quota_sync.py; made at start); None: its own."""
        self.receipt_metrics = ReceiptMetrics(self.metrics.registry, self.router.receipts)
        """Captured / available reuse and stale-index predictions, from the route receipts."""
        self._control_parts()
        self.plane = DataPlane(config, self.router, self.renderer, self.tenants, self.metrics, self.receipt_metrics,
                               self.health.failures, self.admission, self.calls.headers(), self.models.pool_for,
                               self.models.frontend, self.ensure_adapter)
        """What the data plane works with (router/http/data_plane.py): the proxy is given this, not the runtime."""
        self.fleet: Fleet | None = None
        """Whoever can add and remove replica processes (``kvmesh serve``'s launcher); None = fixed set."""
        self._initial = list(replicas or [])
        self._loop: asyncio.AbstractEventLoop | None = None
        self.replicas.on_added(self._added)
        self.replicas.on_removed(self._removed)

    def _control_parts(self) -> None:
        """The parts that watch and call the replicas, each given what it uses."""
        config, router, calls = self.config, self.router, self.calls
        self.stream_watch = StreamWatch(config.events.max_lag_s, router)
        """Degrades replicas whose event stream stalled, lags or lost batches (router/control/stream_watch.py)."""
        self.subscriber_config: SubscriberConfig = config.events
        """Limits of the event feed (bad-frame threshold, blocks per source, back-off): the router's events section."""
        self.feed = EventFeed(router, self.metrics, self.stream_watch, self.subscriber_config)
        """The subscriber and what its batches and statuses do (router/control/event_feed.py)."""
        self.kv_peers = KVPeerRegistry(self.replicas, calls)
        """Registers the replica set on the replicas with KV transfer on (their pull peers, kv_peers.py)."""
        self.health = PassiveHealth(config, router, self.metrics, calls, self.feed, self.kv_peers)
        """Deadlines and ejections from what the replicas' answers say (passive_health.py)."""
        self.outliers = self.health.outliers
        self.models = RouterModels(config, self.replicas, self.tokenizer, self.renderer, calls)
        """What each replica serves, the pool a request's "model" picks, a tokenizer per base model (models.py)."""
        self.adapters = AdapterLoads(self.replicas, calls, self.models)
        """LoRA adapters loaded on replicas that lack them, and the admin's load calls (adapter_loads.py)."""
        self.probes = ReplicaProbes(config, router, calls, self.feed, self.health, self.kv_peers, self.models)
        """Probes every replica's /health and /load, and /server_info when it becomes healthy (probes.py)."""
        self.probes.follow_advertised = self._follow_advertised

    @property
    def subscriber(self) -> EventSubscriber | None:
        """The KV event feed's subscriber (started with the runtime)."""
        return self.feed.subscriber

    @property
    def pool(self) -> UpstreamPool | None:
        """Keep-alive connections to the replicas carrying the proxied requests (router/http/upstream.py)."""
        return self.calls.requests

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.calls.start()
        self.plane.pool = self.calls.requests
        self.kv_peers.start(self._loop)
        self.feed.start()
        for spec in self._initial:
            self.add_replica(spec)
        context = self.tokenizer.max_model_len if self.tokenizer is not None else None
        self.sync = RouterSync.started(self.router, self.config, context, self._loop)
        self.plane.turn = self.sync.take_turn if self.sync is not None else None
        await self.probes.probe_all()
        self.probes.start_polling()
        self.quota = fleet_quota(self.admission, self.config.responses)
        if self.quota is not None:
            self.quota.start()

    async def stop(self) -> None:
        if self.quota is not None:
            await self.quota.stop()
        await self.kv_peers.stop()
        await self.probes.stop()
        await self.health.stop()
        await asyncio.to_thread(self.feed.close)
        if self.sync is not None:
            await asyncio.to_thread(self.sync.close)
        self.calls.close()
        self.renderer.close()
        self.models.close()

    def check_model(self, model: str | None) -> None:
        """The router's own /tokenize and /render: 404 for a model no replica serves (``pool_for``), 400 for one
        tokenized with another tokenizer than the router's own (its replicas answer those paths)."""
        pool = self.models.pool_for(model)
        if pool is not None and self.models.frontend(pool)[1] is not self.renderer:
            raise ProtocolError(f"the router tokenizes and renders here for its own model only; send this request "
                                f"for `{echo(model)}` to one of its replicas", 400, param="model")

    def pool_for(self, model: str | None) -> ModelPool | None:
        """The replicas a request's ``"model"`` may go to (None: all); 400/404 (models.py)."""
        return self.models.pool_for(model)

    def frontend_for(self, pool: ModelPool | None) -> tuple[Tokenizer | None, PromptRenderer]:
        """The tokenizer and renderer of the pool's base model."""
        return self.models.frontend(pool)

    async def ensure_adapter(self, replica: Replica, pool: ModelPool | None) -> None:
        """Load the pool's adapter on ``replica`` when it lacks it (AdapterLoadError: it did not load)."""
        if pool is not None and pool.lora_name is not None:
            await self.adapters.ensure(replica, pool)

    # ---------------------------------------------------------------- replica set
    @property
    def draining(self) -> frozenset[str]:
        """Replicas that get no new requests (``drain``) until removed or re-registered."""
        return frozenset(r.id for r in self.replicas if r.draining)

    def add_replica(self, spec: ReplicaSpec) -> Replica:
        """Register a replica, or re-register it with new endpoints (its tree is dropped then); its record."""
        old = self.replicas.get(spec.replica_id)
        if old is not None and spec in (old.spec, old.advertised_from):  # the same, or the same before its
            return old                                                    # /server_info named its events
        if old is not None:
            self.remove_replica(spec.replica_id)
        replica = self.router.add_replica(spec.replica_id, healthy=False, role=spec.role, spec=spec)
        logger.info("replica %s (%s) registered at %s (events %s)", spec.replica_id, spec.role, spec.url, spec.events)
        return replica

    def _follow_advertised(self, replica: Replica, advertised: ReplicaSpec) -> None:
        """Re-register ``replica`` with the event endpoints its /server_info advertises (event_discovery.py)."""
        given = replica.spec
        logger.info("replica %s advertises its KV events at %s (replay %s): following them", replica.id,
                    advertised.events, advertised.replay)
        self.add_replica(advertised).advertised_from = given

    def remove_replica(self, replica_id: str) -> bool:
        """Forget the replica named ``replica_id`` (the admin's and the fleet's word); False: no such replica."""
        return self.router.remove_replica(replica_id) is not None

    def _added(self, replica: Replica) -> None:
        """The set's listener: follow its events, probe it now, tell the KV peers."""
        spec = replica.spec
        if spec is None:  # registered on the router alone (tests): nothing to follow or probe
            return
        if spec.events and self.subscriber is not None:
            from kvmesh.events.config import PublisherSource

            self.subscriber.add_source(PublisherSource(spec.replica_id, spec.events, spec.replay))
        if self._loop is not None:  # probe now rather than at the next poll
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.probes.probe(replica)))
        self.kv_peers.changed()

    def _removed(self, replica: Replica) -> None:
        """The set's listener: stop following its events, tell the KV peers."""
        if replica.spec is not None and replica.spec.events and self.subscriber is not None:
            self.subscriber.remove_source(replica.id)
        self.kv_peers.changed()

    def drain(self, replica: Replica) -> None:
        """Stop routing new requests to a replica; running ones finish."""
        if not replica.draining:
            logger.info("replica %s draining: no new requests, %d in flight", replica.id, self.in_flight(replica))
        replica.state = DRAINING
        self.router.set_healthy(replica, False)

    def in_flight(self, replica: Replica) -> int:
        """Requests this router (all its processes, when they share counts) sent to the replica that
        have not finished (streams until their last byte)."""
        if replica.removed:
            return 0
        self.router.loads.refresh()
        return replica.load.total_in_flight

    async def refresh_fleet_metrics(self) -> None:
        """Read every replica's vllm:* series for this /metrics scrape, each within the connect timeout."""
        pool = self.calls.control
        if pool is None:  # not started
            return
        timeout_s = self.config.upstream.connect_timeout_s
        headers = {**self.calls.headers(), "accept": "text/plain"}

        async def fetch(url: str) -> tuple[int, bytes]:
            status, _, body = await pool.fetch("GET", url, "/metrics", timeout_s, b"", headers)
            return status, body

        await self.fleet_metrics.refresh(self.replicas, fetch)

    # ---------------------------------------------------------------- events
    def feed_state(self) -> Json:
        """The event feed's thread: ``alive`` (bool), ``error`` (its last crash, or None) and
        ``restarts`` -- for ``/health`` (a dead feed freezes cache-aware routing)."""
        sub = self.subscriber
        if sub is None:
            return {"alive": False, "error": "the event feed is not started", "restarts": 0}
        return {"alive": sub.feed_alive, "error": sub.feed_error, "restarts": sub.feed_restarts}

    # ---------------------------------------------------------------- metrics
    def metrics_state(self) -> dict:
        """What ``/metrics`` reads of this router's state at a scrape (metrics_state.py)."""
        return metrics_state(self.router, self.feed, self.feed_state(), self.sync)
