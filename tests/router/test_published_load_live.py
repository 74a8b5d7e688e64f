"""Two routers in separate processes, sharing no memory, in front of one real replica (stories260K): requests sent
through one of them show in the other's load view from the load the replica publishes on its event stream, the two
views alike whenever they hold the same update (GET /replicas: ``load_seq``, ``decode_load``). Their ``/load`` polls
are a minute apart, so only the published load can tell the second router."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

pytestmark = pytest.mark.slow
ADMIN_KEY = "published-load-admin"  # GET /replicas is the admin plane


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _router(model: Path, replica: ReplicaRuntime, log: Path) -> Iterator[str]:
    """A ``kvmesh router`` process in front of ``replica`` (its URL); stopped on exit."""
    ends, port = replica.endpoints(), _free_port()
    spec = f"{replica.http.url},events={ends['events_endpoint']},replay={ends['replay_endpoint']},name=r0"
    cmd = [sys.executable, "-m", "kvmesh.cluster.cli", "router", "--host", "127.0.0.1", "--port", str(port),
           "--model", str(model), "--replica", spec, "--poll-interval-s", "60"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1",
                                                                             "KVMESH_ADMIN_KEY": ADMIN_KEY})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _row(url, quiet=True).get("healthy"):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _row(url: str, quiet: bool = False) -> dict:
    try:
        rows = httpx.get(f"{url}/replicas", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=5).json()[
            "replicas"]
    except (httpx.HTTPError, ValueError, KeyError):
        if quiet:
            return {}
        raise
    return rows[0] if rows else {}


def _complete(url: str, out: list) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "temperature": 0.0, "stream": True}
    try:  # streamed: its first bytes come at once, so no deadline of the router's runs out on a busy machine
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
            text = "".join(resp.iter_text())
        out.append(resp.status_code if resp.status_code == 200 and "[DONE]" in text else (resp.status_code,
                                                                                          text[-300:]))
    except httpx.HTTPError as e:
        out.append(repr(e))


def test_a_second_router_sees_the_first_routers_requests_from_the_published_load(stories_path, tmp_path):
    replica = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20),
                                   ReplicaServerConfig(port=0, event_port=0, replay_port=0,
                                                       served_model_name="stories"))
    try:
        with _router(stories_path, replica, tmp_path / "a.log") as a, _router(stories_path, replica,
                                                                              tmp_path / "b.log") as b:
            done: list = []
            senders = [threading.Thread(target=_complete, args=(a, done)) for _ in range(4)]
            for t in senders:
                t.start()
            # (running, decode_load) of both routers when they read the same update: `running` is what the update
            # said; a's decode_load also counts what a sent since (its own in-flight), b's is the update's alone
            same_update = []
            deadline = time.monotonic() + 60
            while len(done) < len(senders) and time.monotonic() < deadline:
                ra, rb = _row(a), _row(b)
                if ra.get("load_seq") is not None and ra.get("load_seq") == rb.get("load_seq"):  # defaults omitted
                    same_update.append(((ra.get("running", 0), ra.get("decode_load", 0)),
                                        (rb.get("running", 0), rb.get("decode_load", 0))))
            for t in senders:
                t.join(timeout=120)
            assert done == [200] * 4
            busy = [(va, vb) for va, vb in same_update if vb[1] >= 2]
            assert busy, f"b never saw the requests at an update both read: {same_update[:20]}"
            assert all(va[0] == vb[0] for va, vb in same_update), same_update  # one update, one count in both
            assert all(vb[1] == vb[0] for _, vb in busy), busy  # router b sent nothing: its load is the update's
            assert _row(b).get("in_flight", 0) == 0  # b's own count: nothing went through it
    finally:
        replica.shutdown(graceful_s=1)
