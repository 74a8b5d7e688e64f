"""Stored responses outlive a router and are every router's: two ``kvmesh router`` processes on this host in front of
one real stories260K replica share one database (the SQLite file, or a real PostgreSQL server). A three-turn
conversation by ``previous_response_id`` goes through the routers in turn; the router that stored the first turn is
SIGKILLed and started again between turns 2 and 3: every turn answers, the continuations report cached tokens, and
every stored response is there afterwards through either router (and another tenant's key finds none of them).

Two router processes on one host, not two Ray nodes: what the routers share is the database, whichever host they
run on, and the test helpers start routers as processes far more cheaply than Ray nodes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

from .tool_chat_template import CHATML_TOOLS_TEMPLATE

pytestmark = pytest.mark.slow

KEY, ADMIN = "router-key-0123456789", "admin-key-0123456789"
TENANTS = {"ann": "sk-ann-0123456789", "bob": "sk-bob-0123456789"}
STORY = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her dog "
         "Max. One day the sun was shining and the birds were singing in the tall green trees.")


@pytest.fixture(scope="module")
def replica(stories_path):
    engine = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8)
    server = ReplicaServerConfig(port=0, event_port=0, replay_port=0, served_model_name="stories")
    runtime = ReplicaRuntime.start(engine, server, frontend=FrontendConfig(chat_template=CHATML_TOOLS_TEMPLATE))
    yield runtime
    runtime.shutdown(graceful_s=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RouterProcess:
    """One ``kvmesh router`` on a fixed port, started (and started again) from one config file."""

    def __init__(self, config: str, spec: str) -> None:
        self.port, self.config, self.spec = free_port(), config, spec
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RouterProcess:
        return self.launch().wait_routing()

    def launch(self) -> RouterProcess:
        """Start the process; returns at once (``wait_routing`` waits until it routes)."""
        self.proc = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.cli", "router", "--config", self.config,
                                      "--port", str(self.port), "--replica", self.spec],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def wait_routing(self) -> RouterProcess:
        assert self.proc is not None
        deadline = time.monotonic() + 120
        while not self._routes():
            assert self.proc.poll() is None, f"the router exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "the router did not route in 120 s"
            time.sleep(0.3)
        return self

    def _routes(self) -> bool:
        try:
            rows = httpx.get(f"{self.url}/replicas", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)
        except httpx.TransportError:
            return False
        return rows.status_code == 200 and any(r["healthy"] for r in rows.json()["replicas"])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def write_config(tmp_path, stories_path, responses: dict) -> str:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": key, "tenant": name} for name, key in TENANTS.items()]}))
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "router": {"model": str(stories_path), "served_model_name": "stories", "api_key": KEY, "admin_key": ADMIN,
                   "responses": responses, "admission": {"keys_file": str(keys)},
                   "upstream": {"poll_interval_s": 0.2}},
        "frontend": {"chat_template": CHATML_TOOLS_TEMPLATE}}))
    return str(config)


def turn(router: RouterProcess, text: str, previous: str | None = None) -> dict:
    body = {"model": "stories", "input": text, "max_output_tokens": 8, "temperature": 0}
    if previous is not None:
        body["previous_response_id"] = previous
    r = httpx.post(f"{router.url}/v1/responses", json=body, timeout=120,
                   headers={"Authorization": f"Bearer {TENANTS['ann']}"})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_conversation_survives_a_killed_router_and_is_every_routers(database, replica, stories_path, tmp_path,
                                                                      request):
    responses = {"path": str(tmp_path / "responses.sqlite3")} if database == "sqlite" else \
        {"dsn": request.getfixturevalue("postgres").new_database()}
    config = write_config(tmp_path, stories_path, responses)
    endpoints = replica.endpoints()
    spec = f"{replica.http.url},events={endpoints['events_endpoint']},replay={endpoints['replay_endpoint']}"
    a, b = RouterProcess(config, spec), RouterProcess(config, spec)
    try:
        a.launch(), b.launch()  # both start up at once
        a.wait_routing(), b.wait_routing()
        first = turn(a, STORY)
        second = turn(b, "What did Lily do next?", first["id"])
        assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
        a.kill()  # SIGKILL: nothing flushed, nothing said goodbye
        a.start()
        third = turn(a, "And then?", second["id"])
        assert third["usage"]["input_tokens_details"]["cached_tokens"] > 0
        assert third["previous_response_id"] == second["id"]
        for router in (a, b):
            for stored in (first, second, third):
                own = httpx.get(f"{router.url}/v1/responses/{stored['id']}", timeout=30,
                                headers={"Authorization": f"Bearer {TENANTS['ann']}"})
                assert own.status_code == 200 and own.json()["output"] == stored["output"]
                other = httpx.get(f"{router.url}/v1/responses/{stored['id']}", timeout=30,
                                  headers={"Authorization": f"Bearer {TENANTS['bob']}"})
                assert other.status_code == 404 and "not found" in other.json()["error"]["message"]
    finally:
        a.stop(), b.stop()
