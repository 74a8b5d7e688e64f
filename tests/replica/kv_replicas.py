"""Replicas with KV transfer on (the in-process ``local`` transport) for the HTTP transfer tests."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import httpx
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

from ..conftest import CHAT_TEMPLATE

SEED = "a-shared-cluster-hash-seed"  # replicas of one cluster hash alike
KEY = "kv-transfer-test-key"


@contextlib.contextmanager
def kv_replica(stories_path, api_key: str | None = KEY, lease_ttl_s: float = 30.0, enabled: bool = True,
               transport: str = "local", kv: dict | None = None, replica_id: str = "replica-0",
               **engine) -> Iterator[ReplicaRuntime]:
    """A replica with KV transfer on (``kv``: more KVTransferConfig fields: caps, peers)."""
    config = EngineConfig(model=str(stories_path), hash_seed=SEED, **{"kv_cache_memory": 4 << 20, **engine})
    runtime = ReplicaRuntime.start(
        config, ReplicaServerConfig(port=0, event_port=None, api_key=api_key),
        frontend=FrontendConfig(chat_template=CHAT_TEMPLATE), replica_id=replica_id,
        kv_transfer=KVTransferConfig(enabled=enabled, transport=transport, lease_ttl_s=lease_ttl_s, timeout_s=5.0,
                                     **(kv or {})))
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


def register(puller: ReplicaRuntime, *holders: ReplicaRuntime) -> None:
    """Register ``holders`` as ``puller``'s peers (``POST /kv/peers``, as the router does)."""
    peers = [{"replica_id": f"holder-{i}", "url": h.http.url} for i, h in enumerate(holders)]
    with client(puller) as c:
        r = c.post("/kv/peers", json={"peers": peers})
        assert r.status_code == 200 and r.json()["peers"] == len(holders), r.text


def client(runtime: ReplicaRuntime, api_key: str | None = KEY) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=runtime.http.url, headers=headers, timeout=60)


def metric(c: httpx.Client, name: str, labels: str = "") -> float:
    """One sample of the replica's /metrics (``labels`` as written inside the braces, e.g. ``end="expired"``)."""
    text = c.get("/metrics").text
    pattern = rf"^{re.escape(name)}(?:\{{{re.escape(labels)}\}})? ([0-9.e+-]+)$" if labels \
        else rf"^{re.escape(name)} ([0-9.e+-]+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"{name}{{{labels}}} not in /metrics"
    return float(found.group(1))


def wait_for(check, what: str, limit_s: float = 30.0) -> None:
    """Poll ``check()`` until true (the effect, not a sleep); fails naming ``what`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {limit_s} s"
        time.sleep(0.02)
