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
               transport: str = "local", **engine) -> Iterator[ReplicaRuntime]:
    config = EngineConfig(model=str(stories_path), hash_seed=SEED, **{"kv_cache_memory": 4 << 20, **engine})
    runtime = ReplicaRuntime.start(
        config, ReplicaServerConfig(port=0, event_port=None, api_key=api_key),
        frontend=FrontendConfig(chat_template=CHAT_TEMPLATE),
        kv_transfer=KVTransferConfig(enabled=enabled, transport=transport, lease_ttl_s=lease_ttl_s, timeout_s=5.0))
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


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
