"""Registering the replica set on the replicas with KV transfer on: ``POST /kv/peers`` (the internal key).

A replica pulls only from a registered peer's ``remote_url`` (replica/server/kv_peers.py), so the router tells
each one the set it routes to, ``{"router_id", "ttl_s", "peers": [{"replica_id", "url"}, ...]}``. The replica
keeps one set per router (``router_id``: this router's, made at start) and merges them, so routers in front of the
same replicas never replace each other's; this router's set replaces its own last one:

    a replica added, re-registered or removed     -> every healthy replica with transfer on (in the background)
    a replica turning healthy (a probe, or its     -> awaited before it is routed to: that replica and every
    probe request after an ejection)                 healthy one, so a restarted replica gets the set again
    every upstream.kv_peers_renew_s               -> every healthy replica with transfer on (the renewal)

A registration lapses ``RENEWALS_TO_LAPSE`` renewals after it was made (``ttl_s``), so a router that stopped
leaves no peers behind. A push that fails is logged and retried at the next renewal; until then that replica
computes its prompts instead of pulling them (or pulls by another router's set).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING

import msgspec
from kvmesh.router.http.upstream import UpstreamError

if TYPE_CHECKING:
    from kvmesh.router.config import ReplicaSpec
    from kvmesh.router.control.replica_calls import ReplicaCalls
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.replicas.replica_set import ReplicaSet

logger = logging.getLogger(__name__)
RENEWALS_TO_LAPSE = 3
"""A registration's ttl_s, in renewals: a replica keeps this router's set until it missed this many."""


class KVPeerRegistry:
    """See the module doc; one per ``RouterRuntime``."""

    def __init__(self, replicas: ReplicaSet, calls: ReplicaCalls) -> None:
        """``replicas``: the router's set (registered on the replicas with transfer on); ``calls``: its client."""
        self.replicas, self.calls = replicas, calls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self.router_id = f"router-{secrets.token_hex(8)}"
        """Who registers (a replica keeps one set per router); new at each start of the router."""
        self.pushes = 0
        """``POST /kv/peers`` answered 200 (tests read it)."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``, inside it: renew the registrations every ``upstream.kv_peers_renew_s`` from now on."""
        self._loop = loop
        task = loop.create_task(self._renew())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.calls.upstream.kv_peers_renew_s)
            try:
                await self.push(self._healthy_targets())
            except Exception:  # noqa: BLE001 - the next renewal tries again; a dead loop would let every set lapse
                logger.exception("renewing the KV peer registrations failed; retrying in %.3g s",
                                 self.calls.upstream.kv_peers_renew_s)

    def body(self) -> bytes:
        specs = [r.spec for r in self.replicas if r.spec is not None]
        ttl_s = RENEWALS_TO_LAPSE * self.calls.upstream.kv_peers_renew_s
        return msgspec.json.encode({"router_id": self.router_id, "ttl_s": ttl_s,
                                    "peers": [{"replica_id": s.replica_id, "url": s.url} for s in specs]})

    def _healthy_targets(self) -> list[ReplicaSpec]:
        return [r.spec for r in self.replicas if r.healthy and r.spec is not None and r.load.kv_transfer_enabled]

    def changed(self) -> None:
        """The replica set changed (any thread): push it to every healthy replica with transfer on, soon."""
        if self._loop is None:
            return  # not started: the start-up probes push it
        self._loop.call_soon_threadsafe(self._spawn)

    def _spawn(self) -> None:
        task = asyncio.ensure_future(self.push(self._healthy_targets()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def before_healthy(self, replica: Replica) -> None:
        """``replica`` is about to be routed to: the set to it (transfer on) and to every healthy replica."""
        targets, spec = self._healthy_targets(), replica.spec
        if not replica.removed and replica.load.kv_transfer_enabled and spec not in targets:
            targets.append(spec)
        await self.push(targets)

    async def push(self, targets: list[ReplicaSpec]) -> None:
        if targets:
            body = self.body()
            await asyncio.gather(*(self._post(spec, body) for spec in targets))

    async def _post(self, spec: ReplicaSpec, body: bytes) -> None:
        headers = {"content-type": "application/json", **self.calls.headers()}
        pool = self.calls.requests
        if pool is None:
            return  # not started
        try:
            status, _, raw = await pool.fetch("POST", spec.url, "/kv/peers", self.calls.upstream.connect_timeout_s,
                                              body, headers)
        except (UpstreamError, OSError, asyncio.TimeoutError, ValueError) as e:
            logger.info("registering peers on replica %s failed (%r); it computes prompts until the next push",
                        spec.replica_id, e)
            return
        if status == 200:
            self.pushes += 1
        else:
            logger.warning("replica %s answered POST /kv/peers with HTTP %d: %s", spec.replica_id, status, raw[:200])

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
