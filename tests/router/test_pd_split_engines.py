"""The split with real replicas: the router in front of two stories260K kvmesh replicas with KV transfer on (the
in-process ``local`` transport, tests/replica/kv_replicas.py), one registered as role=prefill. A 428-token prompt
no replica has seen is prefilled on one and decoded on the other, which reports the pulled tokens as cached and
gives the same greedy text as a single replica. And a peer pull: two replicas publishing KV events, round robin
sends a prompt's second request away from its holder, which pulls the prefix instead of computing it."""

from __future__ import annotations

import contextlib
import random

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.routing.kv_placement import KVPlacementRules
from kvmesh.router.routing.receipts import HEADER_PREFILL, HEADER_PULLED_FROM, HEADER_PULLED_TOKENS

from ..conftest import CHAT_TEMPLATE
from ..replica.kv_replicas import KEY, SEED, kv_replica
from .conftest import wait_for

PROMPT = [random.Random(32).randrange(3, 500) for _ in range(428)]  # 26 full blocks of 16
BODY = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def replicas(stories_path):
    with kv_replica(stories_path) as prefill, kv_replica(stories_path) as decode, kv_replica(stories_path) as alone:
        yield prefill, decode, alone


def greedy_text_alone(alone) -> str:
    r = httpx.post(alone.http.url + "/v1/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_a_long_prompt_is_prefilled_on_one_replica_and_decoded_on_the_other(replicas, tokenizer):
    prefill, decode, alone = replicas
    specs = [ReplicaSpec(prefill.http.url, replica_id="p", role="prefill"),
             ReplicaSpec(decode.http.url, replica_id="d", role="decode")]
    router = RouterServer(RouterConfig(port=0,
                                       upstream=UpstreamConfig(poll_interval_s=0.1, replica_api_key=KEY)), specs,
                          tokenizer=tokenizer).start()
    try:
        wait_for(lambda: len(router.runtime.router.healthy) == 2, timeout=30, what="both replicas healthy")
        r = httpx.post(router.url + "/v1/completions", json=BODY, headers={"x-kvmesh-receipt": "1"}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvmesh-replica"] == "d" and r.headers[HEADER_PREFILL] == "p"
        assert int(r.headers[HEADER_PULLED_TOKENS]) >= 384
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 384
        assert r.json()["choices"][0]["text"] == greedy_text_alone(alone)
        sample = router.runtime.metrics.registry.get_sample_value
        assert sample("kvmesh_router_pd_splits_total", {"outcome": "ok"}) == 1
        assert sample("kvmesh_router_kv_pulled_tokens_total") >= 384
    finally:
        router.stop()


@contextlib.contextmanager
def replica_with_events(stories_path):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.kv_transfer.config import KVTransferConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    runtime = ReplicaRuntime.start(
        EngineConfig(model=str(stories_path), hash_seed=SEED, kv_cache_memory=4 << 20),
        ReplicaServerConfig(port=0, event_port=0, replay_port=0, api_key=KEY),
        frontend=FrontendConfig(chat_template=CHAT_TEMPLATE),
        kv_transfer=KVTransferConfig(enabled=True, transport="local", lease_ttl_s=30.0, timeout_s=5.0))
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


def test_a_request_sent_away_from_the_holder_pulls_its_prefix_with_the_same_text(stories_path, tokenizer):
    with replica_with_events(stories_path) as a, replica_with_events(stories_path) as b:
        specs = []
        for name, runtime in (("a", a), ("b", b)):
            ends = runtime.endpoints()
            specs.append(ReplicaSpec(runtime.http.url, ends["events_endpoint"], ends["replay_endpoint"],
                                     replica_id=name))
        # the 10 ms default per-pull overhead is about what a pull costs here (BENCHMARKS.md, "KV transfer between
        # replicas"); the tiny model's
        # prefill rate on this machine may be high enough to price 416 tokens under it: 1 ms keeps the test on the pull
        router = RouterServer(RouterConfig(port=0,
                                           upstream=UpstreamConfig(poll_interval_s=0.1, replica_api_key=KEY),
                                           policy="round_robin",
                                           transfers=KVPlacementRules(peer_pull_overhead_s=0.001)), specs,
                              tokenizer=tokenizer).start()
        try:
            loads = router.runtime.router.loads.loads
            wait_for(lambda: len(router.runtime.router.healthy) == 2 and all(
                load.kv_transfer_enabled for load in loads.values()), timeout=30, what="replicas healthy, transfer on")
            first = httpx.post(router.url + "/v1/completions", json=BODY, headers={"x-kvmesh-receipt": "1"},
                               timeout=120)
            assert first.status_code == 200, first.text
            holder = first.headers["x-kvmesh-replica"]
            index = router.runtime.router.index
            wait_for(lambda: index.num_blocks(holder) >= 26 and loads[holder].prefill_tokens_per_s,
                     timeout=30, what="the holder's blocks in the index and its prefill rate in /load")
            second = httpx.post(router.url + "/v1/completions", json=BODY, headers={"x-kvmesh-receipt": "1"},
                                timeout=120)
            assert second.status_code == 200, second.text
            assert second.headers["x-kvmesh-replica"] != holder and second.headers[HEADER_PULLED_FROM] == holder
            assert int(second.headers[HEADER_PULLED_TOKENS]) == 416
            assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 416
            assert second.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
            assert router.runtime.metrics.registry.get_sample_value("kvmesh_router_peer_pulls_total") == 1
        finally:
            router.stop()
