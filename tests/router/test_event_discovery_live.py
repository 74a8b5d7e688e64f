"""``kvmesh router --replica http://127.0.0.1:PORT`` and nothing else, in front of a real stories260K replica: the
router follows the event stream the replica advertises in ``/server_info`` (its index holds the replica's blocks,
``/replicas`` says where the endpoints came from), and a prompt repeated after 5 s reports cached tokens. Given the
model's tokenizer too (``--model``, what prefix matching needs), the repeated prompt is routed to the blocks the
index holds after the router's own prediction expired (``predict_ttl_s`` is 2)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

pytestmark = pytest.mark.slow
ADMIN = "admin-key-0123456789"
"""Only to read ``/replicas`` (the admin plane), given in the environment: the command line names the replica alone."""

PROMPT = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her dog "
          "Max. One day the sun was shining and the birds were singing in the tall green trees.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = check()
            if found:
                return found
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def replica(stories_path):
    engine = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8)
    runtime = ReplicaRuntime.start(engine, ReplicaServerConfig(port=0, event_port=0, replay_port=0))
    yield runtime
    runtime.shutdown(graceful_s=1)


def index_blocks(url: str) -> float:
    """Blocks the router's index holds (its /metrics), all replicas together."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("kvmesh_router_index_blocks{"))


@pytest.mark.parametrize("with_model", [False, True], ids=["url-alone", "with-model"])
def test_a_router_given_only_the_replicas_url_follows_its_advertised_events(replica, stories_path, with_model):
    port = free_port()
    model_args = ["--model", str(stories_path)] if with_model else []
    router = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.cli", "router", "--port", str(port), *model_args,
                               "--replica", replica.http.url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "KVMESH_ADMIN_KEY": ADMIN})
    url = f"http://127.0.0.1:{port}"
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        rows = wait_until(lambda: [r for r in httpx.get(f"{url}/replicas", headers=admin, timeout=5).json()["replicas"]
                                   if r["healthy"] and r["events"]], "the replica healthy with its events")
        assert rows[0]["events_source"] == "advertised"
        assert rows[0]["events"] == replica.endpoints()["events_endpoint"]

        def complete() -> httpx.Response:
            r = httpx.post(f"{url}/v1/completions", headers={"x-kvmesh-receipt": "1"}, timeout=60,
                           json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
            return r

        complete()
        wait_until(lambda: index_blocks(url) > 0, "the replica's events in the router's index", 30)
        time.sleep(5.0)  # the router's own prediction of those blocks has expired: only the events tell
        again = complete()
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        if with_model:
            assert int(again.headers["x-kvmesh-best-hit-tokens"]) > 0
    finally:
        router.terminate()
        _, err = router.communicate(timeout=30)
    assert "advertises its KV events" in err and "routed without its KV events" not in err
