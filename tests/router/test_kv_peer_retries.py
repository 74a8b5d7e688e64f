"""A replica that keeps refusing the router's KV peer registration (``POST /kv/peers``): it gets no pull planned
while its registration is missing, the router tries it again on a doubling wait capped at the renewal period (never
a tight loop), and one registration that lands ends the retries. The replica's answers come from a scripted pool,
no server."""

from __future__ import annotations

import asyncio
from itertools import pairwise

from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.kv_peers import RETRY_FIRST_S, KVPeerRegistry
from kvmesh.router.control.replica_calls import ReplicaCalls
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.replicas.replica_set import ReplicaSet


class ScriptedPool:
    """Answers each ``POST /kv/peers`` with the next status of ``statuses`` (an exception is raised), noting when."""

    def __init__(self, statuses: list[int | Exception]) -> None:
        self.statuses, self.times = list(statuses), []

    async def fetch(self, method, url, path, timeout_s, body=None, headers=None):
        assert (method, path) == ("POST", "/kv/peers")
        self.times.append(asyncio.get_running_loop().time())
        status = self.statuses.pop(0) if self.statuses else 200
        if isinstance(status, Exception):
            raise status
        return status, {}, b"{}"


def registry(statuses, renew_s: float) -> tuple[KVPeerRegistry, Replica, ScriptedPool]:
    replicas = ReplicaSet()
    replica = replicas.add(Replica("a", spec=ReplicaSpec("http://127.0.0.1:9", replica_id="a"), healthy=True))
    replica.load.kv_transfer_enabled = True
    calls = ReplicaCalls(RouterConfig(upstream=UpstreamConfig(kv_peers_renew_s=renew_s)))
    calls.requests = pool = ScriptedPool(statuses)  # type: ignore[assignment]
    return KVPeerRegistry(replicas, calls), replica, pool


def test_a_refused_registration_is_retried_on_a_doubling_wait_capped_at_the_renewal_until_one_lands():
    async def run():
        reg, replica, pool = registry([503, OSError("refused"), 503, 503, 200], renew_s=1.5)
        reg._loop = asyncio.get_running_loop()  # started without the renewal task: only retries post
        await reg.before_healthy(replica)
        assert replica.kv_peers_pending
        for _ in range(100):
            await asyncio.sleep(0.1)
            if not replica.kv_peers_pending:
                break
        await reg.stop()
        return replica, pool

    replica, pool = asyncio.run(run())
    assert not replica.kv_peers_pending and len(pool.times) == 5
    waits = [b - a for a, b in pairwise(pool.times)]
    expected = [RETRY_FIRST_S, 2 * RETRY_FIRST_S, 1.5, 1.5]  # doubling, capped at kv_peers_renew_s
    assert all(e - 0.01 <= w < e + 0.9 for w, e in zip(waits, expected, strict=True)), waits  # a loaded loop is late


def test_a_retry_still_pending_at_stop_is_cancelled():
    async def run():
        reg, replica, pool = registry([503] * 10, renew_s=600.0)
        reg._loop = asyncio.get_running_loop()
        await reg.before_healthy(replica)
        await reg.stop()
        await asyncio.sleep(RETRY_FIRST_S + 0.2)
        return pool

    assert len(asyncio.run(run()).times) == 1
