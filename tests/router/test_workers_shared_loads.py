"""``--workers N``: a request in flight through one worker counts in every worker's load view.

Two real router workers (stories260K tokenizer) in front of a stub replica that answers after
4 s. ``GET /replicas`` reports a replica's in-flight requests as the worker answering it sees
them; the accept queue is shared, so polling it with a connection per request reaches both.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time

import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.workers import router_workers

from .conftest import ADMIN, ADMIN_KEY
from .helpers import stub_replica

pytestmark = pytest.mark.slow


def _get(port: int, path: str) -> tuple[str | None, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Connection": "close", **ADMIN})  # the replica list: the admin plane
        resp = conn.getresponse()
        return resp.getheader("x-kvmesh-router-worker"), json.loads(resp.read())
    finally:
        conn.close()


def _post_completion(port: int, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 1}),
                     {"Content-Type": "application/json", "Connection": "close"})
        resp = conn.getresponse()
        resp.read()
        out.append((resp.status, resp.getheader("x-kvmesh-router-worker")))
    except (OSError, http.client.HTTPException) as e:
        out.append((None, repr(e)))
    finally:
        conn.close()


def _views(port: int, until, timeout: float = 60.0) -> dict[str, int]:
    """Poll ``/replicas`` until ``until(views)``, views = worker -> the stub's in-flight count it reports."""
    views: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while not until(views):
        assert time.monotonic() < deadline, f"worker views {views}"
        worker, body = _get(port, "/replicas")
        row = body["replicas"][0]
        if row["healthy"]:
            views[worker] = row["in_flight"]
    return views


@pytest.fixture(scope="module")
def slow_stub_url():
    with stub_replica(delay_ms=4000) as url:
        yield url


def test_a_long_request_through_one_worker_shows_in_the_other_workers_load_view(slow_stub_url, stories_path):
    config = RouterConfig(port=0, model=str(stories_path), upstream=UpstreamConfig(poll_interval_s=0.1),
                          workers=2, admin_key=ADMIN_KEY)
    pool = router_workers(config, [ReplicaSpec(slow_stub_url, replica_id="stub")], 2).start()
    try:
        _views(pool.port, lambda v: set(v) == {"0", "1"})  # both workers up and see the replica healthy
        done: list = []
        request = threading.Thread(target=_post_completion, args=(pool.port, done))
        request.start()
        # every worker, not only the one holding the request, counts it while it runs
        views = _views(pool.port, lambda v: set(v) == {"0", "1"} and all(n == 1 for n in v.values()),
                       timeout=3.0)
        assert views == {"0": 1, "1": 1}
        request.join(30)
        assert done and done[0][0] == 200
        assert _views(pool.port, lambda v: set(v) == {"0", "1"}) == {"0": 0, "1": 0}
    finally:
        pool.stop(timeout_s=10)


def test_a_killed_worker_s_requests_leave_the_other_workers_load_view(slow_stub_url, stories_path):
    config = RouterConfig(port=0, model=str(stories_path), upstream=UpstreamConfig(poll_interval_s=0.1),
                          workers=2, admin_key=ADMIN_KEY)
    pool = router_workers(config, [ReplicaSpec(slow_stub_url, replica_id="stub")], 2).start()
    try:
        _views(pool.port, lambda v: set(v) == {"0", "1"})
        done: list = []
        request = threading.Thread(target=_post_completion, args=(pool.port, done))
        request.start()
        holder = None  # /get_load counts the answering worker's own requests only
        deadline = time.monotonic() + 3.0
        while holder is None:
            assert time.monotonic() < deadline, "no worker reported the request"
            worker, body = _get(pool.port, "/get_load")
            if body[0]["num_reqs"] == 1:
                holder = worker
        os.kill(pool.pids[int(holder)], signal.SIGKILL)
        request.join(30)
        assert done and done[0][0] is None  # it had started on the killed worker: it fails (the workers' contract)
        # its count went with it: every worker (the survivor, the replacement) sees nothing in flight
        assert _views(pool.port, lambda v: set(v) == {"0", "1"} and not any(v.values())) == {"0": 0, "1": 0}
    finally:
        pool.stop(timeout_s=10)
