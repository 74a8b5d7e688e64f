"""``--workers N``: N router processes on one port, each serving; a dead one comes back alone.

Two workers of the real router (stories260K tokenizer, cache_aware) in front of a stub replica
that answers after 100 ms, so requests are in flight when a worker is killed. The client opens a
connection per request and never retries: a failure is a failure.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.workers import RouterWorkers, bind_listener, router_workers

from .conftest import wait_for
from .helpers import stub_replica

pytestmark = pytest.mark.slow


@dataclass
class Result:
    sent_at: float
    ok: bool
    worker: str | None
    error: str = ""


def _post(port: int, body: dict) -> Result:
    sent_at = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json",
                                                                   "Connection": "close"})
        resp = conn.getresponse()
        resp.read()
        return Result(sent_at, resp.status == 200, resp.getheader("x-kvmesh-router-worker"),
                      "" if resp.status == 200 else f"HTTP {resp.status}")
    except (OSError, http.client.HTTPException) as e:
        return Result(sent_at, False, None, repr(e))
    finally:
        conn.close()


def _keep_alive_client(port: int):
    """A real client's behaviour: httpx, one pooled keep-alive connection, no retries."""
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def post(body: dict) -> Result:
        sent_at = time.monotonic()
        try:
            r = client.post("/v1/completions", json=body)
            return Result(sent_at, r.status_code == 200, r.headers.get("x-kvmesh-router-worker"),
                          "" if r.status_code == 200 else f"HTTP {r.status_code}")
        except httpx.HTTPError as e:
            return Result(sent_at, False, None, repr(e))

    return post, client.close


class Load:
    """``clients`` threads posting back to back until stopped (at most ``limit`` requests each).

    Each client opens a connection per request, or (``keep_alive``) reuses one through httpx.
    """

    def __init__(self, port: int, clients: int = 8, limit: int = 400, keep_alive: bool = False) -> None:
        self.results: list[Result] = []
        self._stop = threading.Event()
        body = {"prompt": "Once upon a time there was a little girl", "max_tokens": 1}

        def client():
            post, close = _keep_alive_client(port) if keep_alive else (lambda b: _post(port, b), lambda: None)
            try:
                for _ in range(limit):
                    if self._stop.is_set():
                        return
                    self.results.append(post(body))
            finally:
                close()

        self._threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def stop(self) -> list[Result]:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        return self.results


@pytest.fixture(scope="module")
def stub_url():
    with stub_replica(delay_ms=100) as url:
        yield url


@pytest.fixture(scope="module")
def workers(stub_url, stories_path):
    """One pool for the module (each worker is a spawned interpreter loading the router): a test that kills a worker
    waits until its restart serves again, so the next test finds both serving."""
    config = RouterConfig(port=0, model=str(stories_path), upstream=UpstreamConfig(poll_interval_s=0.1), workers=2)
    pool = router_workers(config, [ReplicaSpec(stub_url, replica_id="stub")], 2).start()
    try:
        _wait_serving(pool, {"0", "1"})
        yield pool
    finally:
        pool.stop(timeout_s=10)


def _wait_serving(pool: RouterWorkers, expected: set[str], timeout: float = 90.0) -> None:
    """Until every worker in ``expected`` has answered a request."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while not expected <= seen:
        assert time.monotonic() < deadline, f"workers {sorted(expected - seen)} never served"
        load = Load(pool.port, clients=4, limit=4)
        seen |= {r.worker for r in load.stop() if r.ok}


def test_every_worker_serves_the_same_port(workers):
    load = Load(workers.port, clients=8, limit=8)
    results = load.stop()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert {r.worker for r in results} == {"0", "1"}


def _wait_flowing(load: Load) -> None:
    """Until both workers have answered requests of ``load``: the load runs through each of them."""
    wait_for(lambda: {"0", "1"} <= {r.worker for r in list(load.results) if r.ok}, timeout=30,
             what="both workers to serve the load")


def _wait_answered_after(load: Load, t: float, count: int = 80) -> None:
    """Until ``count`` requests of ``load`` sent after ``t`` (monotonic) have an outcome, ok or not:
    the load went on well past ``t`` (8 clients, a stub answering in 100 ms: about 1 s)."""
    wait_for(lambda: sum(r.sent_at > t for r in list(load.results)) >= count, timeout=30,
             what=f"{count} requests sent after {t:.2f} to be answered")


def test_crashed_worker_fails_only_requests_it_already_held_and_comes_back(workers):
    before, restarts = workers.pids, list(workers.restarts)
    load = Load(workers.port)
    _wait_flowing(load)
    killed_at = time.monotonic()
    os.kill(before[0], signal.SIGKILL)
    _wait_answered_after(load, killed_at + 0.05)
    results = load.stop()
    failed = [r for r in results if not r.ok]
    print(f"SIGKILL of one of 2 workers under 8 clients: {len(failed)} of {len(results)} requests failed, "
          f"all sent before the kill")
    assert [r for r in failed if r.sent_at > killed_at + 0.05] == []  # nothing sent after the kill failed
    assert len(failed) <= 8  # at most the requests in flight on the dead worker (one per client)
    assert sum(r.ok and r.sent_at > killed_at for r in results) > 0  # the other worker kept serving
    wait_for(lambda: workers.pids[0] not in (None, before[0]), timeout=30, what="worker 0 restarted")
    assert workers.pids[1] == before[1]  # the other worker was not restarted
    _wait_serving(workers, {"0"})
    assert workers.restarts == [restarts[0] + 1, restarts[1]]


@pytest.mark.parametrize("keep_alive", [False, True], ids=["connection-per-request", "keep-alive"])
def test_gracefully_stopped_worker_fails_nothing(workers, keep_alive):
    before = workers.pids
    load = Load(workers.port, keep_alive=keep_alive)
    _wait_flowing(load)
    os.kill(before[1], signal.SIGTERM)
    # the whole graceful stop under load: until the worker has exited (its drain and in-flight
    # requests done), then the load goes on without it
    wait_for(lambda: workers.pids[1] != before[1], timeout=30, what="worker 1 to exit after SIGTERM")
    _wait_answered_after(load, time.monotonic())
    results = load.stop()
    assert [r.error for r in results if not r.ok] == []
    wait_for(lambda: workers.pids[1] not in (None, before[1]), timeout=30, what="worker 1 restarted")
    _wait_serving(workers, {"1"})


def test_taken_port_is_a_clear_error():
    taken = bind_listener("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError, match="cannot listen on 127.0.0.1"):
            RouterWorkers(print, 2, "127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


def test_negative_workers_is_rejected():
    with pytest.raises(ValueError, match="workers must be >= 1, or 0 for auto"):
        RouterConfig(workers=-1)


def test_worker_that_cannot_start_makes_the_pool_give_up_with_a_reason():
    # sys.exit(sock, index) raises TypeError in the worker: it dies at once, every time
    pool = RouterWorkers(sys.exit, 1, restart_delay_s=0.05, max_restart_delay_s=0.05, max_quick_exits=3).start()
    try:
        wait_for(lambda: pool.failed is not None, timeout=60, what="the pool to give up")
        assert "exited 3 times" in pool.failed and "last exit code 1" in pool.failed
    finally:
        pool.stop(timeout_s=5)
