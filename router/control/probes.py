"""Probing the replicas: ``/health`` and ``/load`` on every poll, ``/server_info`` when one becomes healthy.

A probe is also how a failed replica comes back -- unless outlier detection ejected it: then ``/health`` is not
enough (passive_health.py, which also reads each ``/load`` for signs that the replica is working). ``/load`` is decoded
as kvmesh's ``LoadReport``
(replica/serving/load_report.py); another server's load JSON is read by its keys (``ReplicaLoad.update_report``).
Its ``kv_transfer`` object (KV transfer on, the measured pull rate: router/routing/kv_placement.py prices peer
pulls with it) is read whatever the report's kind. ``/server_info`` says whether a replica's cache can be described by
the router's keys (block size,
tokenizer and chat-template fingerprint; else it is routed by load only), which body it takes
(router/http/token_forwarding.py) and, for a replica registered without them, its event endpoints
(router/control/event_discovery.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.router.config import ReplicaSpec, RouterConfig
from kvmesh.router.control.event_discovery import advertised_spec
from kvmesh.router.http.token_forwarding import ServerInfo, upstream_kind
from kvmesh.router.http.upstream import UpstreamConnectError, UpstreamError, UpstreamPool
from kvmesh.router.replicas.foreign_load import ForeignLoad
from kvmesh.router.replicas.replica import INCOMPATIBLE, Replica
from kvmesh.router.routing.kv_router import KVRouter

if TYPE_CHECKING:
    from kvmesh.replica.serving.tokenizer import Tokenizer
    from kvmesh.router.control.event_feed import EventFeed
    from kvmesh.router.control.kv_peers import KVPeerRegistry
    from kvmesh.router.control.models import RouterModels
    from kvmesh.router.control.passive_health import PassiveHealth
    from kvmesh.router.control.replica_calls import ReplicaCalls

logger = logging.getLogger(__name__)


class ReplicaProbes:
    """The runtime's probes and the task that polls every replica each ``poll_interval_s``."""

    def __init__(self, config: RouterConfig, router: KVRouter, calls: ReplicaCalls, feed: EventFeed,
                 health: PassiveHealth, kv_peers: KVPeerRegistry, models: RouterModels) -> None:
        """What a probe's answers go to: the router's set and loads, the event feed's stream checks, passive
        health, the KV peers and the models; ``calls``: the router's client (its control pool)."""
        self.config, self.router, self.calls, self.feed = config, router, calls, feed
        self.health, self.kv_peers, self.models = health, kv_peers, models
        self.follow_advertised: Callable[[Replica, ReplicaSpec], None] | None = None
        """Re-registers a replica with the event endpoints it advertises (the runtime's); None: not followed."""
        self._poller: asyncio.Task | None = None

    @property
    def pool(self) -> UpstreamPool | None:
        """The control calls' keep-alive connections (router/control/replica_calls.py)."""
        return self.calls.control

    def start_polling(self) -> None:
        self._poller = asyncio.create_task(self._poll_loop())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)

    async def probe(self, replica: Replica) -> bool:
        """GET /health (and /load when it has one); marks the replica healthy or not."""
        spec, rid = replica.spec, replica.id
        timeout_s = self.config.upstream.connect_timeout_s
        turned_on = False  # KV transfer on in this /load, off (or unknown) in the last; or no peers registered
        try:
            status, _, _ = await self.pool.fetch("GET", spec.url, "/health", timeout_s, headers=self.calls.headers())
            ok = status == 200
            if ok:
                sent_at = time.time()
                status, _, raw = await self.pool.fetch("GET", spec.url, "/load", timeout_s,
                                                       headers=self.calls.headers())
                report = decode_load(raw) if status == 200 else None
                if report is not None and not replica.removed:
                    load = replica.load
                    load.update_report(report)
                    if isinstance(report, LoadReport):
                        self.models.on_load(replica, report)  # the adapters it has now
                    was_on, transfer, problem = load.kv_transfer_enabled, decode_transfer(raw), load.kv_layout_problem
                    load.update_transfer(transfer)
                    say_layout_problem(replica, problem)
                    turned_on = load.kv_transfer_enabled and (not was_on or transfer.get("registered_peers") == 0)
                    self.check_stream(replica, report, sent_at, time.time())
                    self.health.check_progress(replica, report, load.queued_prefill_tokens)
            connect_error = False
        except (UpstreamError, OSError, asyncio.TimeoutError, ValueError) as e:
            ok, connect_error = False, isinstance(e, UpstreamConnectError)
        if replica.removed or replica.spec is not spec:
            return ok  # removed or re-registered meanwhile
        self.feed.stream_watch.tick(replica, self.feed.subscriber.disconnected_s(rid)
                                    if spec.events and self.feed.subscriber is not None else None)
        was = replica.healthy
        if self.health.after_probe(replica, ok):
            pass  # ejected: only its probe request re-admits it (passive_health.py)
        elif ok and not was and not replica.draining:
            logger.info("replica %s is healthy", rid)
            await self.check_compatible(replica)
            if replica.removed:
                return ok  # re-registered with the event endpoints it advertises: the new record is probed
            await self.kv_peers.before_healthy(replica)  # its pull peers (and it among the others') first
            self.router.set_healthy(replica, True)
        elif turned_on and was:
            await self.kv_peers.push([replica])  # healthy already, transfer only now on (or restarted): its pull peers
        if not ok and was:
            self.health.failures.mark_failed(replica, connect_error, "does not answer /health", kind=None)
        elif not ok and connect_error:
            self.router.set_healthy(replica, False, clear_cache=True)
        return ok

    def check_stream(self, replica: Replica, report: LoadReport | ForeignLoad, sent_at: float,
                     received_at: float) -> None:
        """Hold a ``/load`` report (asked for at ``sent_at``, answered at ``received_at``) against the
        last batch of the replica the router applied: a stalled stream degrades it (StreamWatch)."""
        if not replica.spec.events or self.feed.subscriber is None:
            return  # no stream to fall behind
        stats = self.feed.subscriber.stats.get(replica.id)
        applied = stats.last_seq if stats is not None else -1
        self.feed.stream_watch.on_report(replica, report, applied, sent_at, received_at)

    async def check_compatible(self, replica: Replica) -> None:
        """Degrade (load-only routing) a replica whose cache the router's keys cannot describe: another
        block size, tokenizer or chat template (its ``/server_info``, against the tokenizer of the model it
        serves: its ``/v1/models``, router/control/models.py). Replicas that do not say (vLLM) are trusted. Also notes
        whether it is a kvmesh replica (``"version": "kvmesh"``), which takes
        the router's token ids for chat too (router/http/token_forwarding.py)."""
        spec = replica.spec
        try:
            status, _, raw = await self.pool.fetch("GET", spec.url, "/server_info",
                                                   self.config.upstream.connect_timeout_s, headers=self.calls.headers())
            info = msgspec.json.decode(raw) if status == 200 else None
        except (UpstreamError, OSError, asyncio.TimeoutError, ValueError):
            info = None
        info = info if isinstance(info, dict) else None
        await self.models.learn(replica, info)  # what it serves (its /v1/models), its model's tokenizer ready
        tokenizer = self.models.tokenizer_of(replica)
        if not replica.removed and replica.spec is spec:
            replica.accepts = upstream_kind(info, tokenizer)
        self.check_salt_secret(replica, info)
        self.check_events(replica, info)
        if replica.removed:
            return
        reason = incompatibility(info, self.config.block_size, tokenizer)
        if reason is not None:
            logger.warning("replica %s is routed by load only: %s", replica.id, reason)
            self.router.set_degraded(replica, reason, INCOMPATIBLE)

    def check_events(self, replica: Replica, info: ServerInfo | None) -> None:
        """A replica registered without event endpoints: follow those it advertises (router/control/
        event_discovery.py), else say that it is routed without its events."""
        spec = replica.spec
        if spec is None or spec.events or replica.removed:
            return
        advertised = advertised_spec(spec, info)
        if advertised is not None and self.follow_advertised is not None:
            self.follow_advertised(replica, advertised)
            return
        logger.warning("replica %s is routed without its KV events (by load only): none given (--replica "
                       "URL,events=tcp://HOST:PORT) and its /server_info advertises none", replica.id)

    def check_salt_secret(self, replica: Replica, info: ServerInfo | None) -> None:
        """Note whether ``replica`` hashes salted prompts with the router's salt secret; warn when it does not."""
        theirs = info.get("salt_secret_check") if info is not None else None
        match = theirs == self.router.hasher.salt_secret_check() if isinstance(theirs, str) else None
        if match is False and replica.salt_keys_match is not False:
            logger.warning("replica %s hashes salted prompts with another salt secret than this router's%s: requests "
                           "with a cache_salt get no prefix matches on it. Give the router the cluster's salt secret: "
                           "router.cache_salt_secret or KVMESH_ROUTER_CACHE_SALT_SECRET, 64 hex characters (the "
                           "cluster record's router_secrets.cache_salt_secret)", replica.id,
                           " (it has none)" if self.router.hasher.salt_secret is None else "")
        replica.salt_keys_match = match

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(r) for r in self.router.replicas if r.spec is not None),
                             return_exceptions=True)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.upstream.poll_interval_s)
            try:
                await self.probe_all()
            except Exception:  # never let the poller die
                logger.exception("replica poll failed")


def decode_load(raw: bytes) -> LoadReport | ForeignLoad | None:
    """A ``/load`` body: kvmesh's ``LoadReport``, else another server's JSON object, else None.
    Raises ``ValueError`` (msgspec's DecodeError) for a body that is not JSON."""
    try:
        return msgspec.json.decode(raw, type=LoadReport)
    except msgspec.ValidationError:
        value = msgspec.json.decode(raw)
        return value if isinstance(value, dict) else None


class _TransferPart(msgspec.Struct):
    kv_transfer: dict | None = None


def decode_transfer(raw: bytes) -> dict | None:
    """``/load``'s ``kv_transfer`` object (``{"enabled", "pull_bytes_per_s", "bytes_per_token"}``), or None."""
    try:
        return msgspec.json.decode(raw, type=_TransferPart).kv_transfer
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def say_layout_problem(replica: Replica, before: str | None) -> None:
    """Log once why ``replica``'s advertised KV layout is unusable (router/replicas/kv_share.py), and once that it
    is usable again; ``before``: its problem before this ``/load``."""
    problem = replica.load.kv_layout_problem
    if problem is not None and problem != before:
        logger.warning("replica %s is paired with no replica for KV transfer (no peer pull, no prefill/decode split "
                       "with it): %s", replica.id, problem)
    elif problem is None and before is not None:
        logger.info("replica %s advertises a usable KV layout again: it may be paired for KV transfer", replica.id)


def incompatibility(info: ServerInfo | None, block_size: int, tokenizer: Tokenizer | None) -> str | None:
    """Why a replica's ``/server_info`` shows that its blocks cannot match the router's keys, or None."""
    if not isinstance(info, dict):
        return None
    theirs = info.get("block_size")
    if isinstance(theirs, int) and theirs != block_size:
        return f"its block size is {theirs} tokens, the router's {block_size} (set router.block_size to the replicas')"
    fingerprint = info.get("tokenizer_fingerprint")
    ours = tokenizer.fingerprint if tokenizer is not None else None
    if isinstance(fingerprint, str) and ours is not None and fingerprint != ours:
        return (f"its tokenizer or chat template differs from the router's (fingerprint {fingerprint} != {ours}); "
                "give the router the replicas' model/tokenizer and frontend.chat_template")
    return None
