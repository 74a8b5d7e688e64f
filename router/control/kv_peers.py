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
leaves no peers behind. A push that fails is logged and that replica alone is tried again after ``RETRY_FIRST_S``,
the wait doubling up to the renewal period, until one lands. Meanwhile it may lack the set, and a replica skips a
pull from a peer it does not know, so the router plans no pull to it (``Replica.kv_peers_pending``,
router/routing/peer_pulls.py) rather than send one it would skip.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING

import msgspec
from kvmesh.router.http.upstream import UpstreamError

if TYPE_CHECKING:
    from kvmesh.router.control.replica_calls import ReplicaCalls
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.replicas.replica_set import ReplicaSet

logger = logging.getLogger(__name__)
RENEWALS_TO_LAPSE = 3
"""A registration's ttl_s, in renewals: a replica keeps this router's set until it missed this many."""
RETRY_FIRST_S = 0.5
"""Seconds before a replica whose registration failed is tried again (then twice as long each time it fails again,
up to ``upstream.kv_peers_renew_s``)."""


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
        self._retries: dict[Replica, tuple[float, asyncio.TimerHandle | None]] = {}
        """Replica whose registration failed -> (the wait before its next try, that try's timer; None while a push
        to it is under way)."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``, inside it: renew the registrations every ``upstream.kv_peers_renew_s`` from now on."""
        self._loop = loop
        self._keep(loop.create_task(self._renew()))

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

    def _healthy_targets(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy and r.spec is not None and r.load.kv_transfer_enabled]

    def changed(self) -> None:
        """The replica set changed (any thread): push it to every healthy replica with transfer on, soon."""
        if self._loop is None:
            return  # not started: the start-up probes push it
        self._loop.call_soon_threadsafe(self._spawn)

    def _spawn(self) -> None:
        self._keep(asyncio.ensure_future(self.push(self._healthy_targets())))

    def _keep(self, task: asyncio.Task) -> None:
        """Hold ``task`` until it is done (``stop`` cancels what is left)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def before_healthy(self, replica: Replica) -> None:
        """``replica`` is about to be routed to: the set to it (transfer on) and to every healthy replica."""
        targets = self._healthy_targets()
        if (not replica.removed and replica.load.kv_transfer_enabled and replica.spec is not None
                and replica not in targets):
            targets.append(replica)
        await self.push(targets)

    async def push(self, targets: list[Replica]) -> None:
        if targets:
            body = self.body()
            await asyncio.gather(*(self._post(replica, body) for replica in targets))

    async def _post(self, replica: Replica, body: bytes) -> None:
        """One registration on ``replica``: counted when it lands, else retried (``_failed``)."""
        headers = {"content-type": "application/json", **self.calls.headers()}
        pool, spec = self.calls.requests, replica.spec
        if pool is None or spec is None:
            return  # not started, or known by id only
        try:
            status, _, raw = await pool.fetch("POST", spec.url, "/kv/peers", self.calls.upstream.connect_timeout_s,
                                              body, headers)
        except (UpstreamError, OSError, asyncio.TimeoutError, ValueError) as e:
            self._failed(replica, f"registering peers on replica {replica.id} failed ({e!r})")
            return
        if status == 200:
            self.pushes += 1
            replica.kv_peers_pending = False
            self._cancel_retry(replica)
        else:
            self._failed(replica, f"replica {replica.id} answered POST /kv/peers with HTTP {status}: {raw[:200]!r}")

    def _failed(self, replica: Replica, why: str) -> None:
        """A registration that did not land: no pull is planned to ``replica`` until one does; tried again soon."""
        replica.kv_peers_pending = True
        wait_s, timer = self._retries.get(replica, (RETRY_FIRST_S / 2, None))
        if timer is not None or self._loop is None:
            return  # a try is already set (it goes out with the set as it is then), or not started
        wait_s = min(2 * wait_s, self.calls.upstream.kv_peers_renew_s)
        logger.warning("%s; no pull goes to it until a registration lands, next try in %.3g s", why, wait_s)
        self._retries[replica] = (wait_s, self._loop.call_later(wait_s, self._retry, replica))

    def _retry(self, replica: Replica) -> None:
        wait_s, _ = self._retries[replica]
        if replica.removed or not replica.kv_peers_pending:
            self._retries.pop(replica, None)
            return
        self._retries[replica] = (wait_s, None)  # the next failure sets the next try
        self._keep(asyncio.ensure_future(self._post(replica, self.body())))

    def _cancel_retry(self, replica: Replica) -> None:
        _, timer = self._retries.pop(replica, (0.0, None))
        if timer is not None:
            timer.cancel()

    async def stop(self) -> None:
        for _, timer in self._retries.values():
            if timer is not None:
                timer.cancel()
        self._retries.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
