"""``kvmesh serve`` of stories260K started in a test on the session's Ray (the live cluster tests' one helper)."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from kvmesh.cluster.config.loader import from_dict
from kvmesh.cluster.fleet.operations import Fleet
from kvmesh.cluster.launch.launcher import ServeCluster


def start_cluster(stories_path, tmp_path_factory, name: str, *, replicas: dict | None = None,
                  router: dict | None = None, **sections) -> ServeCluster:
    """A started cluster (one replica unless ``replicas`` says otherwise, ephemeral ports, no restarts, its
    own Ray namespace); a cluster that does not start fails the test with serve's messages.
    ``serve.messages`` keeps what serve reported."""
    config = from_dict({
        "engine": {"model": str(stories_path), "kv_cache_memory": "16MiB", "max_num_batched_tokens": 512},
        "replicas": {"num_replicas": 1, "max_restarts": 0, "http_port": 0, "event_port": 0, **(replicas or {})},
        "router": {"port": 0, **(router or {})},
        "ray": {"namespace": f"kvmesh-{name}-{os.getpid()}", "ready_timeout_s": 240}, **sections})
    messages: list[str] = []
    serve = ServeCluster(config, report=messages.append, supervise_interval_s=0.5,
                         admin_keys_dir=str(tmp_path_factory.mktemp("clusters")), fleet=Fleet)
    serve.messages = messages
    try:
        serve.start()
    except Exception as e:
        serve.stop()
        pytest.fail(f"cluster did not start: {type(e).__name__}: {e}\n" + "\n".join(messages))
    return serve


def admin_headers(cluster: ServeCluster) -> dict:
    """The cluster's admin key (from the key file serve wrote) as an Authorization header."""
    return {"Authorization": f"Bearer {json.loads(cluster.admin_key_file.read_text())['admin_key']}"}


def fleet_idle(state: dict) -> bool:
    """``/admin/fleet`` reports no operation running or queued."""
    return state["busy"] is None and state["queued"] == 0


def wait_fleet(cluster: ServeCluster, predicate, timeout_s: float, what: str) -> dict:
    """Poll ``/admin/fleet`` until ``predicate(state)``; fails naming ``what`` with serve's last messages."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = httpx.get(cluster.url + "/admin/fleet", headers=admin_headers(cluster), timeout=10).json()
        if predicate(state):
            return state
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}: {state}\n" + "\n".join(cluster.messages[-20:]))
