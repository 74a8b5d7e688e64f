"""serve with ``router.workers: 2`` (cluster/launch/serve_router.py): a control router owns the replica set,
two router processes serve the port and follow it; the admin plane works through either of them.

Driven as the launcher drives it (``start_router``), with stub replicas instead of Ray actors.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time

import pytest
from kvmesh.cluster.launch.serve_router import RouterProcesses, start_router
from kvmesh.cluster.router_client import RouterClient
from kvmesh.router.config import RouterConfig, UpstreamConfig

pytestmark = pytest.mark.slow
ADMIN_KEY = "admin-key-for-tests-0123456789"


def _request(port: int, method: str, path: str, body: dict | None = None, admin: bool = False):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Connection": "close", "Content-Type": "application/json"}
    if admin:
        headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("x-kvmesh-router-worker"), json.loads(resp.read())
    finally:
        conn.close()


def _every_worker(port: int, check, timeout: float = 30.0) -> None:
    """Until both workers' ``GET /replicas`` satisfy ``check(rows)``."""
    ok: set[str] = set()
    deadline = time.monotonic() + timeout
    while ok != {"0", "1"}:
        assert time.monotonic() < deadline, f"workers {sorted({'0', '1'} - ok)} never agreed"
        _, worker, body = _request(port, "GET", "/replicas", admin=True)  # the admin plane; each worker its own view
        if check(body["replicas"]):
            ok.add(worker)
        else:
            ok.discard(worker)


@pytest.fixture(scope="module")
def stubs():
    procs = [subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.support.fake_replica", "--port",
                               "0"],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        yield [f"http://127.0.0.1:{json.loads(p.stdout.readline())['port']}" for p in procs]
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def test_one_worker_is_the_in_process_router(stories_path):
    router = start_router(RouterConfig(port=0, model=str(stories_path)), 1)
    try:
        assert not isinstance(router, RouterProcesses)
        assert router.runtime.fleet is None  # the launcher sets it, as before
    finally:
        router.stop()


def test_two_workers_follow_the_control_router_and_pass_the_admin_plane_to_it(stubs, stories_path):
    config = RouterConfig(host="127.0.0.1", port=0, model=str(stories_path),
                          upstream=UpstreamConfig(poll_interval_s=0.1),
                          admin_key=ADMIN_KEY)
    router = start_router(config, 2)
    client = RouterClient(router.control_url, admin_key=ADMIN_KEY)
    try:
        assert isinstance(router, RouterProcesses)
        port = router.workers.port
        # serve's supervisor registers at the control router; both workers follow
        client.register("replica-0", stubs[0], None, None)
        router.wait_workers_see(1)
        _every_worker(port, lambda rows: [r["id"] for r in rows if r["healthy"]] == ["replica-0"])
        status, _, _ = _request(port, "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 1})
        assert status == 200
        # every worker refuses the router's own fields and keeps the replicas' URLs from tenants
        for _ in range(4):
            status, _, body = _request(port, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 1,
                                                                        "kv_transfer_params": None})
            assert status == 400 and body["error"]["param"] == "kv_transfer_params"
            assert _request(port, "GET", "/replicas")[0] == 403
        # an operator's registration through the public port lands on one worker and reaches all
        status, _, body = _request(port, "POST", "/replicas", {"url": stubs[1], "id": "replica-1"}, admin=True)
        assert status == 200 and body["id"] == "replica-1"
        assert {r["id"] for r in client.replicas()} == {"replica-0", "replica-1"}
        router.wait_workers_see(2)
        # so does a drain, and /admin/* answers from the control router (no fleet here: 501)
        status, _, body = _request(port, "POST", "/replicas/replica-0/drain", admin=True)
        assert status == 200 and body["draining"]
        _every_worker(port, lambda rows: {r["id"]: r["draining"] for r in rows} == {"replica-0": True,
                                                                                   "replica-1": False})
        status, _, body = _request(port, "POST", "/admin/scale", {"replicas": 3}, admin=True)
        assert status == 501 and "kvmesh serve" in body["error"]["message"]
        # the admin plane still needs the admin key
        status, _, _ = _request(port, "DELETE", "/replicas/replica-1")
        assert status == 403
        status, _, _ = _request(port, "DELETE", "/replicas/replica-1", admin=True)
        assert status == 200
        _every_worker(port, lambda rows: [r["id"] for r in rows] == ["replica-0"])
    finally:
        client.close()
        router.stop()
