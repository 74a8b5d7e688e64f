"""The running router: decision core + tokenizer + replica registry + event feed + polling.

``RouterRuntime`` owns what lives as long as the HTTP front: the ``KVRouter``, the tokenizer, the
replica specs, the ``EventSubscriber`` feeding the index, the replica connection pool (router/http/upstream.py),
the aiohttp session of the probes and the task that polls
every replica's ``/health`` and ``/load`` (which is also how a failed replica is probed back).
Replicas can be added, re-registered with new endpoints, drained and removed at runtime: a
draining replica gets no new requests (the health probe never puts it back) while the ones it
runs, streams included, finish; whoever drains it removes it once ``in_flight`` is 0.

A replica whose cache information cannot be trusted is *degraded*: the router routes to it by load
only (``KVRouter.set_degraded``), the other replicas are not touched. Causes: blocks that cannot
match the router's keys (``check_compatible``); a stream that keeps sending bad frames (or batches
over ``max_source_blocks``; the subscriber's guard, until a snapshot resync -- router/control/event_feed.py,
which also stops holding such a replica's events meanwhile); a stream that stalled,
lags or lost batches (``StreamWatch``, router/control/stream_watch.py, from the events and each ``/load``).
``feed_state()`` says whether the feed's thread runs (for ``/health``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import aiohttp
from kvmesh.replica.openai.protocol import check_model
from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.router.config import ReplicaSpec, RouterConfig
from kvmesh.router.control.event_feed import EventFeed
from kvmesh.router.control.stream_watch import StreamWatch
from kvmesh.router.http.metrics import RouterMetrics
from kvmesh.router.http.receipt_metrics import ReceiptMetrics
from kvmesh.router.http.upstream import UpstreamPool
from kvmesh.router.routing.kv_router import INCOMPATIBLE, KVRouter
from kvmesh.router.routing.session import SessionConfig

logger = logging.getLogger(__name__)


class RouterRuntime:
    """See the module doc. ``start``/``stop`` run inside the server's event loop."""

    def __init__(self, config: RouterConfig, replicas: list[ReplicaSpec] | None = None,
                 tokenizer: Any = None) -> None:
        self.config = config
        self.router = KVRouter(config.block_size, config.policy, config.policy_kwargs,
                               seed=secrets.randbits(64), predict_ttl_s=config.predict_ttl_s,
                               sessions=SessionConfig(ttl_s=config.session_ttl_s))
        self.router.hasher.salt_secret = config.cache_salt_secret
        self.stream_watch = StreamWatch(config.events_max_lag_s, self.router.set_degraded)
        """Degrades replicas whose event stream stalled, lags or lost batches (router/control/stream_watch.py)."""
        if tokenizer is None and (config.tokenizer or config.model):
            from kvmesh.replica.serving.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(config.tokenizer or config.model, max_model_len=config.max_model_len,
                                       chat_template=config.frontend.chat_template)
        if tokenizer is not None and config.tokenize_cache_tokens and hasattr(tokenizer, "hf"):
            from kvmesh.router.routing.tokenize_cache import CachedTokenizer

            # Same ids, pieces between added tokens seen before come from a cache (router/routing/tokenize_cache.py).
            tokenizer.cache = CachedTokenizer(tokenizer.hf, config.tokenize_cache_tokens)
        self.tokenizer = tokenizer
        """The replicas' tokenizer (replica/serving/tokenizer.py); None = route without cache awareness."""
        self.renderer = PromptRenderer(tokenizer, config.frontend)
        """Renders requests to token ids off the event loop, as the replicas do."""
        self.metrics = RouterMetrics(self.metrics_state)
        self.receipt_metrics = ReceiptMetrics(self.metrics.registry, self.router.receipts)
        """Captured / available reuse and stale-index predictions, from the route receipts."""
        self.specs: dict[str, ReplicaSpec] = {}
        self._initial = list(replicas or [])
        self.session: aiohttp.ClientSession | None = None
        """HTTP client of the control plane (probes of /health, /load, /server_info)."""
        self.pool: UpstreamPool | None = None
        """Keep-alive connections to the replicas carrying the proxied requests (router/http/upstream.py)."""
        self.draining: set[str] = set()
        """Replicas that get no new requests (``drain``) until removed or re-registered."""
        self.upstream_kinds: dict[str, str] = {}
        """Replica id -> what it accepts instead of text (router/http/token_forwarding.py), from ``/server_info``."""
        self.fleet: Any = None
        """Whoever can add and remove replica processes (``kvmesh serve``'s launcher); None = fixed set."""
        self.subscriber = None
        from kvmesh.events.subscriber import SubscriberConfig

        self.subscriber_config = SubscriberConfig(
            curve_server_key=config.events_curve_server_key, curve_public_key=config.events_curve_public_key,
            curve_secret_key=config.events_curve_secret_key, max_payload_bytes=config.events_max_payload_bytes,
            max_source_blocks=config.events_max_source_blocks,
            # a 16-token block is ~90 B of snapshot: room for a whole cache of events_max_source_blocks
            max_snapshot_bytes=max(SubscriberConfig.max_snapshot_bytes, 128 * config.events_max_source_blocks))
        """Limits of the event feed (bad-frame threshold, blocks per source, back-off)."""
        self.feed = EventFeed(self)
        """Applies the subscriber's batches and statuses (router/control/event_feed.py)."""
        self._poller: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        from kvmesh.events.subscriber import EventSubscriber

        self._loop = asyncio.get_running_loop()
        cfg = self.config
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s,
                                          sock_read=cfg.request_timeout_s),
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        )
        self.pool = UpstreamPool(cfg.connect_timeout_s, cfg.request_timeout_s)
        self.subscriber = EventSubscriber(on_batch=self.feed.on_batch, config=self.subscriber_config,
                                          on_status=self.feed.on_status).start()
        for spec in self._initial:
            self.add_replica(spec)
        await self.probe_all()
        self._poller = asyncio.create_task(self._poll_loop())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self.subscriber is not None:
            await asyncio.to_thread(self.subscriber.close)
        if self.session is not None:
            await self.session.close()
        if self.pool is not None:
            self.pool.close()
        self.renderer.close()

    def check_model(self, model: str | None) -> None:
        """404 for a model other than ``served_model_name`` (None accepts any) or the path a replica also accepts."""
        if self.config.served_model_name is not None:
            check_model(model, self.config.served_model_name, aliases=(self.config.model,) if self.config.model else ())

    # ---------------------------------------------------------------- replica set
    def add_replica(self, spec: ReplicaSpec) -> None:
        """Register a replica, or re-register it with new endpoints (its tree is dropped then)."""
        old = self.specs.get(spec.replica_id)
        if old == spec:
            return
        if old is not None:
            self.remove_replica(spec.replica_id)
        self.specs[spec.replica_id] = spec
        self.draining.discard(spec.replica_id)
        self.router.add_replica(spec.replica_id, healthy=False)
        if spec.events and self.subscriber is not None:
            from kvmesh.events.subscriber import PublisherSource

            self.subscriber.add_source(PublisherSource(spec.replica_id, spec.events, spec.replay))
        if self._loop is not None:  # probe now rather than at the next poll
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.probe(spec)))
        logger.info("replica %s registered at %s (events %s)", spec.replica_id, spec.url, spec.events)

    def remove_replica(self, replica_id: str) -> bool:
        spec = self.specs.pop(replica_id, None)
        self.draining.discard(replica_id)
        self.upstream_kinds.pop(replica_id, None)
        if spec is None:
            return False
        if spec.events and self.subscriber is not None:
            self.subscriber.remove_source(replica_id)
        self.router.remove_replica(replica_id)
        self.stream_watch.forget(replica_id)
        self.feed.forget(replica_id)
        self.metrics.last_event_lag.pop(replica_id, None)
        return True

    def drain(self, replica_id: str) -> bool:
        """Stop routing new requests to a replica; running ones finish. False: no such replica."""
        if replica_id not in self.specs:
            return False
        if replica_id not in self.draining:
            logger.info("replica %s draining: no new requests, %d in flight", replica_id,
                        self.in_flight(replica_id))
        self.draining.add(replica_id)
        self.router.set_healthy(replica_id, False)
        return True

    def in_flight(self, replica_id: str) -> int:
        """Requests this router (all its processes, when they share counts) sent to the replica that
        have not finished (streams until their last byte)."""
        loads = self.router.loads
        load = loads.loads.get(replica_id)
        if load is None:
            return 0
        loads.refresh()
        return load.total_in_flight

    def mark_failed(self, replica_id: str, connect_error: bool) -> None:
        """A request to the replica failed: stop routing to it until a probe succeeds.

        A refused connection means the process is gone and its cache with it: drop its tree.
        """
        if replica_id in self.router.healthy:
            logger.warning("replica %s failed; routing around it until it answers /health", replica_id)
        self.router.set_healthy(replica_id, False, clear_cache=connect_error)

    def headers(self) -> dict[str, str]:
        key = self.config.replica_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    # ---------------------------------------------------------------- events
    def feed_state(self) -> dict[str, Any]:
        """The event feed's thread: ``alive`` (bool), ``error`` (its last crash, or None) and
        ``restarts`` -- for ``/health`` (a dead feed freezes cache-aware routing)."""
        sub = self.subscriber
        if sub is None:
            return {"alive": False, "error": "the event feed is not started", "restarts": 0}
        return {"alive": sub.feed_alive, "error": sub.feed_error, "restarts": sub.feed_restarts}

    # ---------------------------------------------------------------- health and load
    async def probe(self, spec: ReplicaSpec) -> bool:
        """GET /health (and /load when it has one); marks the replica healthy or not."""
        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
        try:
            async with self.session.get(spec.url + "/health", timeout=timeout, headers=self.headers()) as r:
                ok = r.status == 200
            if ok:
                sent_at = time.time()
                async with self.session.get(spec.url + "/load", timeout=timeout, headers=self.headers()) as r:
                    report = await r.json(content_type=None) if r.status == 200 else None
                load = self.router.loads.loads.get(spec.replica_id)
                if isinstance(report, dict) and load is not None:
                    load.update_report(report)
                    self.check_stream(spec, report, sent_at, time.time())
            connect_error = False
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            ok, connect_error = False, isinstance(e, aiohttp.ClientConnectorError)
        if self.specs.get(spec.replica_id) is not spec:
            return ok  # removed or re-registered meanwhile
        self.stream_watch.tick(spec.replica_id, self.subscriber.disconnected_s(spec.replica_id)
                               if spec.events and self.subscriber is not None else None)
        was = spec.replica_id in self.router.healthy
        if ok and not was and spec.replica_id not in self.draining:
            logger.info("replica %s is healthy", spec.replica_id)
            await self.check_compatible(spec)
            self.router.set_healthy(spec.replica_id, True)
        elif not ok and was:
            self.mark_failed(spec.replica_id, connect_error)
        elif not ok and connect_error:
            self.router.set_healthy(spec.replica_id, False, clear_cache=True)
        return ok

    def check_stream(self, spec: ReplicaSpec, report: dict, sent_at: float, received_at: float) -> None:
        """Hold a ``/load`` report (asked for at ``sent_at``, answered at ``received_at``) against the
        last batch of the replica the router applied: a stalled stream degrades it (StreamWatch)."""
        if not spec.events or self.subscriber is None:
            return  # no stream to fall behind
        stats = self.subscriber.stats.get(spec.replica_id)
        applied = stats.last_seq if stats is not None else -1
        self.stream_watch.on_report(spec.replica_id, report, applied, sent_at, received_at)

    async def check_compatible(self, spec: ReplicaSpec) -> None:
        """Degrade (load-only routing) a replica whose cache the router's keys cannot describe: another
        block size, tokenizer or chat template (its ``/server_info``). Replicas that do not say (vLLM)
        are trusted. Also notes whether it is a kvmesh replica (``"version": "kvmesh"``), which takes
        the router's token ids for chat too (router/http/token_forwarding.py)."""
        from kvmesh.router.http.token_forwarding import upstream_kind

        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
        try:
            async with self.session.get(spec.url + "/server_info", timeout=timeout, headers=self.headers()) as r:
                info = await r.json(content_type=None) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            info = None
        self.upstream_kinds[spec.replica_id] = upstream_kind(info, self.tokenizer)
        reason = incompatibility(info, self.config.block_size, self.tokenizer)
        if reason is not None:
            logger.warning("replica %s is routed by load only: %s", spec.replica_id, reason)
            self.router.set_degraded(spec.replica_id, reason, INCOMPATIBLE)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(s) for s in list(self.specs.values())), return_exceptions=True)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            try:
                await self.probe_all()
            except Exception:  # never let the poller die
                logger.exception("replica poll failed")

    # ---------------------------------------------------------------- metrics
    def metrics_state(self) -> dict:
        r = self.router
        with r.lock:
            index_blocks = {str(rid): r.index.num_blocks(rid) for rid in r.index.replica_ids}
            loads = {str(rid): load for rid, load in r.loads.loads.items()}
            stats = r.index.stats
            out = {
                "index_blocks": index_blocks, "index_keys": r.index.num_keys,
                "events_applied": r.events_applied,
                "index": {"orphan_blocks": stats.orphan_blocks, "unknown_removals": stats.unknown_removals},
                "healthy": {rid: rid in r.healthy for rid in loads}, "loads": loads,
                "degraded": {str(rid): dict(r.degraded_causes.get(rid, {})) for rid in r.loads.loads},
            }
        sub = self.subscriber.stats if self.subscriber is not None else {}
        out["subscriber"] = {name: st.as_dict() for name, st in sub.items()}
        out["event_lag"] = dict(self.metrics.last_event_lag)
        out["feed"] = self.feed_state()
        return out


def incompatibility(info: Any, block_size: int, tokenizer: Any) -> str | None:
    """Why a replica's ``/server_info`` shows that its blocks cannot match the router's keys, or None."""
    if not isinstance(info, dict):
        return None
    theirs = info.get("block_size")
    if isinstance(theirs, int) and theirs != block_size:
        return f"its block size is {theirs} tokens, the router's {block_size} (set router.block_size to the replicas')"
    fingerprint = info.get("tokenizer_fingerprint")
    ours = getattr(tokenizer, "fingerprint", None)
    if isinstance(fingerprint, str) and ours is not None and fingerprint != ours:
        return (f"its tokenizer or chat template differs from the router's (fingerprint {fingerprint} != {ours}); "
                "give the router the replicas' model/tokenizer and frontend.chat_template")
    return None
