"""``kvmesh serve`` of stories260K started in a test on the session's Ray (the live cluster tests' one helper)."""

from __future__ import annotations

import os

import pytest
from kvmesh.cluster.config.loader import from_dict
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
                         admin_keys_dir=str(tmp_path_factory.mktemp("clusters")))
    serve.messages = messages
    try:
        serve.start()
    except Exception as e:
        serve.stop()
        pytest.fail(f"cluster did not start: {type(e).__name__}: {e}\n" + "\n".join(messages))
    return serve
