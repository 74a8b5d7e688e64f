"""A tenant that floods the router's bounded queue must not keep a light tenant out of it (router/admission/).

A real router (``--admission-max-queued 8``) with a keys file in front of two fake replicas that say
``max_num_seqs: 4`` in ``/load`` and answer each completion after 0.3 s. The flooding tenant runs 24 clients that
send again the moment they are answered, a 429 included; the light tenant sends one short request every 0.3 s, far
inside any limit. The router runs in this process, or as ``--workers 2`` (their admission shares one ledger).
The driver is ``kvmesh bench queue-flood --url`` in its own process (so the flood does not share
this process's interpreter with the router), bounded to a few seconds. The answer: the light tenant is served
(it takes the place of the flood's newest waiter), the flood is refused with ``429 queue_full`` naming its own
waiting requests and its share, and it gets no more of the replicas' work than its fair share.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.config import RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.control.workers import router_workers

from ..conftest import CHAT_TEMPLATE
from ..router.conftest import ADMIN_KEY, BLOCK_SIZE, launched_fakes, wait_for

KEYS = {"flood": "sk-flood-0123456789", "light": "sk-light-0123456789"}
FLOOD_S = 8.0
DELAY_S = 0.3
MAX_QUEUED = 8


@pytest.fixture(scope="module")
def tokenizer(stories_path):
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    return load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def _fakes():
    with launched_fakes("a", "b") as procs:
        yield procs


@pytest.fixture(scope="module")
def fakes(_fakes):
    """Fakes "a" and "b": four sequences each as far as the router knows, each answer after ``DELAY_S``."""
    for p in _fakes:
        p.configure(delay=DELAY_S, max_num_seqs=4, reset_stats=True)
    yield _fakes
    for p in _fakes:
        p.configure(delay=0, max_num_seqs=0, reset_stats=True)


@pytest.fixture(scope="module", params=[1, 2], ids=["one_process", "workers2"])
def router(request, fakes, tokenizer, stories_path, tmp_path_factory):
    """The router's URL: in this process, or ``--workers 2`` (two processes, one shared admission ledger)."""
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - {{key: {key}, tenant: {name}}}\n" for name, key in KEYS.items()))
    cfg = RouterConfig(port=0, block_size=BLOCK_SIZE, admin_key=ADMIN_KEY, model=str(stories_path),
                       upstream=UpstreamConfig(poll_interval_s=0.05, connect_timeout_s=1.0),
                       admission=AdmissionConfig(keys_file=str(keys), max_queued=MAX_QUEUED), workers=request.param)
    if request.param == 1:
        server = RouterServer(cfg, [p.spec for p in fakes], tokenizer=tokenizer).start()
        loads = server.runtime.router.loads.loads
        wait_for(lambda: all(loads[p.name].max_num_seqs == 4 for p in fakes), what="the replicas' max_num_seqs")
        yield server.url
        server.stop()
        return
    pool = router_workers(cfg, [p.spec for p in fakes], request.param).start()
    try:
        url = f"http://127.0.0.1:{pool.port}"
        _wait_serving(url, {"0", "1"})
        yield url
    finally:
        pool.stop(timeout_s=10)


def _wait_serving(url: str, workers: set[str], timeout_s: float = 90.0) -> None:
    """Until every worker has answered (each has polled the replicas' ``/load`` by then)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=30) as client:
        while not workers <= seen:
            assert time.monotonic() < deadline, f"workers {sorted(workers - seen)} never served"
            r = client.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                            headers={"Authorization": f"Bearer {KEYS['light']}", "Connection": "close"})
            if r.status_code == 200:
                seen.add(r.headers.get("x-kvmesh-router-worker"))
    time.sleep(0.5)  # a few /load polls more: every worker knows the replicas' max_num_seqs


def _flood(url: str, out) -> dict:
    cmd = [sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.queue_flood", "--url", url,
           "--flood-key", KEYS["flood"], "--light-key", KEYS["light"], "--clients", "24",
           "--seconds", str(FLOOD_S), "--alone-s", "0", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=FLOOD_S + 60)
    assert out.exists(), done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def flooded(router, tmp_path_factory):
    return _flood(router, tmp_path_factory.mktemp("flood") / "flood.json")


def test_a_light_tenant_is_served_through_a_queue_a_flood_keeps_full(flooded):
    light = flooded["summary"]["light"]
    assert light["sent"] >= 20
    assert light["served_fraction"] >= 0.9, light  # before: 429 queue_full for nearly every one


def test_the_flood_is_refused_with_its_own_state_and_no_more_than_its_share(flooded):
    summary, flood = flooded["summary"], flooded["summary"]["flood"]
    assert set(flood["refused"]) == {"queue_full"} and flood["refused"]["queue_full"] > 100, flood
    message = next(r["message"] for r in flooded["requests"] if r["cls"] == "flood" and r["status"] == 429)
    assert "tenant 'flood'" in message and "waiting" in message and "share" in message, message
    assert summary["flood_share"] <= summary["flood_fair_share"] + 1e-9, summary
