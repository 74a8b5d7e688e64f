"""The router in front of a real stories260K replica with a host tier: it learns which blocks left the
device for host memory, predicts the host part of a hit, and counts what the replica reports."""

from __future__ import annotations

import random

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import wait_for


@pytest.fixture(scope="module")
def tiered(stories_path):
    """A router in front of one replica with a 51-block device pool and a 64 MiB host tier."""
    config = EngineConfig(model=str(stories_path), kv_cache_memory="1MiB", kv_offload_memory="64MiB")
    replica = ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=0, replay_port=0))
    ends = replica.endpoints()
    spec = ReplicaSpec(replica.http.url, ends["events_endpoint"], ends["replay_endpoint"], replica_id="r0")
    router = RouterServer(RouterConfig(port=0, upstream=UpstreamConfig(poll_interval_s=0.2), access_log=True), [spec],
                          tokenizer=load_tokenizer(stories_path)).start()
    try:
        yield router
    finally:
        router.stop()
        replica.shutdown(graceful_s=1)


def complete(router: RouterServer, prompt: list[int]) -> httpx.Response:
    r = httpx.post(router.url + "/v1/completions", headers={"x-kvmesh-receipt": "1"}, timeout=120,
                   json={"prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def test_router_predicts_and_counts_a_hit_loaded_back_from_the_host_tier(tiered):
    rng = random.Random(3)
    long_prompt = [rng.randrange(3, 500) for _ in range(428)]
    complete(tiered, long_prompt)
    for _ in range(8):
        complete(tiered, [rng.randrange(3, 500) for _ in range(300)])
    core = tiered.runtime.router
    keys = core.hasher.keys(long_prompt)

    def held_on_host_only() -> bool:
        with core.lock:
            tiers = core.index.match_tiers(keys)
            return tiers.device.get("r0", 0) < 16 and tiers.host.get("r0", 0) == len(keys)

    wait_for(held_on_host_only, what="the replica's events moving the prompt to its host tier")
    again = complete(tiered, long_prompt)
    assert int(again.headers["x-kvmesh-predicted-host-hit-tokens"]) >= 256
    details = again.json()["usage"]["prompt_tokens_details"]
    assert details["host_cached_tokens"] >= 256
    metrics = httpx.get(tiered.url + "/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("kvmesh_router_reported_host_cached_tokens_total"))
    assert float(line.split()[-1]) == details["host_cached_tokens"]
