"""Router test fixtures: the replicas' tokenizer, fake replicas in subprocesses, in-process routers."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

FAKE = "kvmesh.cluster.measure.benchmarks.support.fake_replica"
BLOCK_SIZE = 4
ADMIN_KEY = "admin-key"
"""The admin key of ``start_router``'s routers (the replica list needs it); pass admin_key=None for none."""
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


class FakeProc:
    """A fake replica process (kvmesh.cluster.measure.benchmarks.support.fake_replica) that can be killed and restarted
    on the same ports."""

    def __init__(self, name: str, model: str = "stub"):
        self.name = name
        self.model = model
        self.proc: subprocess.Popen | None = None
        self.ports = (0, 0, 0)
        self.info: dict = {}

    def launch(self) -> FakeProc:
        http, ev, rp = self.ports
        self.proc = subprocess.Popen(
            [sys.executable, "-m", FAKE, "--name", self.name, "--port", str(http), "--event-port", str(ev),
             "--replay-port", str(rp), "--block-size", str(BLOCK_SIZE), "--num-blocks", "256", "--model", self.model],
            stdout=subprocess.PIPE, text=True)
        return self

    def wait_ready(self) -> FakeProc:
        line = self.proc.stdout.readline()
        assert line, f"fake replica {self.name} did not start"
        self.info = json.loads(line)
        port = lambda u: int(u.rsplit(":", 1)[1])  # noqa: E731
        self.ports = (port(self.info["url"]), port(self.info["events"]), port(self.info["replay"]))
        return self

    @property
    def spec(self) -> ReplicaSpec:
        return ReplicaSpec(self.info["url"], self.info["events"], self.info["replay"], replica_id=self.name)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def configure(self, **kw) -> None:
        httpx.post(self.info["url"] + "/fake/config", json=kw, timeout=5).raise_for_status()


@contextlib.contextmanager
def launched_fakes(*names: str, models: tuple[str, ...] = ()):
    """Fake replica processes named ``names`` (serving ``models``, one each; default "stub"), ready; killed on
    leaving."""
    procs = [FakeProc(name, *models[i:i + 1]).launch() for i, name in enumerate(names)]
    try:
        yield [p.wait_ready() for p in procs]
    finally:
        for p in procs:
            p.kill()


@pytest.fixture(scope="session")
def tokenizer(stories_path):
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    from ..conftest import CHAT_TEMPLATE

    return load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def _fake_pair():
    with launched_fakes("a", "b") as procs:
        yield procs


@pytest.fixture
def fakes(_fake_pair):
    """Two fake replicas "a" and "b" (shared by the session; a test may kill and relaunch one)."""
    yield _fake_pair
    for p in _fake_pair:
        if p.proc.poll() is not None:
            p.launch().wait_ready()
        p.configure(delay=0, status=200, cut=False, stall_after=0, garbage=False, progress=False, compiling=False,
                    reset_stats=True)


@pytest.fixture
def start_router(tokenizer):
    started = []

    def start(specs, **kw) -> RouterServer:
        upstream = UpstreamConfig(**{"poll_interval_s": 0.1, "connect_timeout_s": 1.0, **kw.pop("upstream", {})})
        cfg = RouterConfig(**{"port": 0, "block_size": BLOCK_SIZE, "upstream": upstream, "admin_key": ADMIN_KEY, **kw})
        server = RouterServer(cfg, specs, tokenizer=tokenizer).start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


def wait_for(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def replica_rows(router, query: str = "") -> list[dict]:
    """``GET /replicas`` (the admin plane: it names the replicas' URLs) of a ``start_router`` router."""
    r = httpx.get(router.url + "/replicas" + query, headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["replicas"]


def fake_stats(fake: FakeProc) -> dict:
    return httpx.get(fake.info["url"] + "/fake/stats", timeout=5).json()
