"""Two routers that sync, each in front of the same two fake replicas (cluster/measure/benchmarks/support/
fake_replica.py): every request waits for its router's turn to decide (router/control/turns.py) and is answered;
the waits show on /metrics, the choices still reach the other router."""

from __future__ import annotations

import httpx
from kvmesh.router.config import SyncConfig

from .conftest import wait_for
from .test_router_http import prompt

INTERNAL_KEY = "internal-key-of-the-turns-test"


def _sync(router) -> dict:
    return router.runtime.sync.counters()


def test_two_synced_routers_route_in_their_turns_and_answer_every_request(fakes, start_router):
    specs = [f.spec for f in fakes]
    a = start_router(specs, internal_key=INTERNAL_KEY, sync=SyncConfig(bind="tcp://127.0.0.1:0"))
    b = start_router(specs, internal_key=INTERNAL_KEY,
                     sync=SyncConfig(bind="tcp://127.0.0.1:0", peers=(a.runtime.sync.endpoint,)))
    a.runtime.sync.set_peers([b.runtime.sync.endpoint])
    for router in (a, b):
        wait_for(lambda r=router: len(r.runtime.router.healthy) == len(fakes), what="replicas healthy")
    for i in range(12):
        for router in (a, b):
            r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(100 + i), "max_tokens": 2},
                           timeout=30)
            assert r.status_code == 200, r.text
    for router in (a, b):
        counters = _sync(router)
        assert counters["published"] == 12
        assert 0 < counters["turn_waits"] <= 12
        assert counters["turn_wait_seconds"] <= counters["turn_waits"] * 2 * SyncConfig().turn_s + 1e-9
    wait_for(lambda: _sync(a)["applied"] >= 1 and _sync(b)["applied"] >= 1, what="each router told the other's")
