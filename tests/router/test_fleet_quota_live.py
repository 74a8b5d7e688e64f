"""A tenant's token-rate limit through two live routers sharing one database (router/control/quota_sync.py): it is
served its rate, not twice it, however it floods them and whatever ``user`` its requests name.

The full measurement (1, 2 and 4 router processes, a light tenant's latency beside) is ``kvmesh bench fleet_quota``."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from kvmesh.replica.openai.responses_api.store_config import ResponsesStoreConfig
from kvmesh.router.admission.config import AdmissionConfig

from .conftest import wait_for

pytestmark = pytest.mark.live
KEY = "sk-heavy-0123456789"
RATE = 100.0
WINDOW_S = 8.0


def _flood(url: str, n: int, stop: threading.Event, served: list, refused: list) -> None:
    with httpx.Client(timeout=10) as client:
        i = 0
        while not stop.is_set():
            i += 1
            r = client.post(url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                            json={"prompt": f"the heavy tenant's question number {n}", "max_tokens": 4,
                                  "user": f"someone-else-{n}-{i}"})  # the key says who it is, not ``user``
            if r.status_code == 200:
                usage = r.json()["usage"]
                served.append((time.monotonic(), usage["prompt_tokens"] + usage["completion_tokens"]))
                continue
            assert r.status_code == 429, r.text
            refused.append(time.monotonic())
            time.sleep(0.05)  # a flood: Retry-After ignored


def test_a_tenant_flooding_two_routers_is_served_its_rate_not_twice_it(fakes, start_router, tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys:\n  - {{key: {KEY}, tenant: heavy, tokens_per_s: {RATE:g}, burst_tokens: 100}}\n")
    database = ResponsesStoreConfig(path=str(tmp_path / "responses.sqlite3"))  # quota.sqlite3 beside it
    routers = [start_router([f.spec for f in fakes], admission=AdmissionConfig(keys_file=str(keys), user_tenants=True),
                            responses=database) for _ in range(2)]
    for router in routers:
        wait_for(lambda r=router: len(r.runtime.router.healthy) == 2, what="both replicas healthy")
    stop, served, refused = threading.Event(), [], []
    threads = [threading.Thread(target=_flood, args=(routers[n % 2].url, n, stop, served, refused))
               for n in range(6)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: bool(refused), timeout=10, what="the burst spent")
        start = time.monotonic() + 0.5
        time.sleep(0.5 + WINDOW_S)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    rate = sum(n for at, n in served if start <= at < start + WINDOW_S) / WINDOW_S
    assert 0.9 * RATE <= rate <= 1.1 * RATE, f"{rate:.1f} tokens/s through two routers, limit {RATE:g}"
    assert all(r.runtime.quota is not None and r.runtime.quota.failures == 0 for r in routers)
