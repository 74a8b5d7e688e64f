"""A router started after its replicas, in front of event streams it cannot replay.

vLLM publishes its KV events without a replay endpoint by default, so a router that starts (or restarts)
after its replicas joins their streams under way: what they published before is never sent again. That is
an incomplete view, not a wrong one -- the router must neither report the streams as lost nor as stalled
("published but not applied"), and must route follow-ups to the replica holding their prefix.
Two real stories260K replicas; the router is told their event streams only (no replay endpoint).
"""

from __future__ import annotations

import time

import httpx
import pytest
from kvmesh.events.config import SubscriberConfig
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import ADMIN_KEY, replica_rows, wait_for

pytestmark = pytest.mark.slow

MAX_LAG_S = 1.0
"""The router's ``events_max_lag_s``: short, so the old stall check would have fired during the test."""

STORY = ("lived in a small house by the sea. Every morning they walked to the park with a big red ball and "
         "played with the dog until the sun was high, and then they went home for lunch with their mother.")
NAMES = ("Lily", "Tom", "Sue", "Max")


def load_seq(url: str) -> int:
    return httpx.get(url + "/load", timeout=10).json()["kv_events_seq"]


def complete(url: str, prompt: str, **headers) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", headers=headers, timeout=60,
                   json={"prompt": prompt, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def test_a_router_started_after_its_replicas_is_exact_and_routes_follow_ups_to_the_holder(stories_path, tokenizer):
    from kvmesh.kvcache.hashing import cache_salt_secret, generate_seed
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    from ..conftest import CHAT_TEMPLATE

    runtimes, router = [], None
    seed = generate_seed()
    try:
        for _ in range(2):
            config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8, hash_seed=seed)
            runtimes.append(ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=0, replay_port=0),
                                                 frontend=FrontendConfig(chat_template=CHAT_TEMPLATE)))
        # Their streams advance before any router listens.
        for i, rt in enumerate(runtimes):
            for n in range(3):
                complete(rt.http.url, f"Before the router, story {i}-{n}: the cat {STORY}")
        for rt in runtimes:
            wait_for(lambda rt=rt: load_seq(rt.http.url) >= 2, what="the warm-up batches published")

        specs = [ReplicaSpec(rt.http.url, rt.endpoints()["events_endpoint"], None, replica_id=f"late{i}")
                 for i, rt in enumerate(runtimes)]  # events only: no replay endpoint, as vLLM by default
        router = RouterServer(RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.2),
                                           events=SubscriberConfig(max_lag_s=MAX_LAG_S),
                                           cache_salt_secret=cache_salt_secret(seed), admin_key=ADMIN_KEY), specs,
                              tokenizer=tokenizer).start()
        wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
        time.sleep(3 * MAX_LAG_S)  # several polls that report batches the router never saw
        health = httpx.get(router.url + "/health", timeout=10).json()
        assert health["status"] == "ok" and health["degraded_replicas"] == {}, health

        served = {}
        for name in NAMES:
            r = complete(router.url, f"{name} {STORY}", **{"x-kvmesh-receipt": "1"})
            served[name] = r.headers["x-kvmesh-replica"]
        index = router.runtime.router.index
        wait_for(lambda: all(index.num_blocks(rid) > 0 for rid in set(served.values())), what="events applied")

        cached = {}
        for name in NAMES:
            r = complete(router.url, f"{name} {STORY} And the next day they did it again.", **{"x-kvmesh-receipt": "1"})
            tokens = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            cached[name] = (r.headers["x-kvmesh-replica"], r.headers["x-kvmesh-route-reason"], tokens)
        assert all(rid == served[n] and reason == "cache" and tokens > 0
                   for n, (rid, reason, tokens) in cached.items()), (served, cached)

        assert router.runtime.router.degraded == {}
        rows = replica_rows(router)
        assert [row.get("degraded") for row in rows] == [None, None], rows
        stats = router.runtime.subscriber.stats
        assert all(stats[s.replica_id].unrecovered == 0 and stats[s.replica_id].late_joins <= 1 for s in specs)
    finally:
        if router is not None:
            router.stop()
        for rt in runtimes:
            rt.shutdown(graceful_s=0.5)
