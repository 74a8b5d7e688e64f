"""The router's HTTP front against fake replicas (real prefix caches and real event streams)."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from kvmesh.router.http.proxy import Forwarder

from .conftest import BLOCK_SIZE, fake_stats, wait_for


def prompt(seed: int, n: int = 64) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def complete(router, ids, **kw):
    r = httpx.post(router.url + "/v1/completions", json={"prompt": ids, "max_tokens": 2, **kw}, timeout=20)
    assert r.status_code == 200, r.text
    return r.json()


def counter(router, name, replica):
    return router.runtime.metrics.registry.get_sample_value(f"kvmesh_router_{name}_total", {"replica": replica}) or 0


def test_shared_prefix_goes_to_its_holder_and_cached_tokens_match_prediction(fakes, start_router):
    router = start_router([f.spec for f in fakes])
    base = prompt(1)
    holder = complete(router, base)["choices"][0]["text"]
    index = router.runtime.router.index
    wait_for(lambda: index.num_blocks(holder) >= len(base) // BLOCK_SIZE, what="BlockStored events")
    # The session's fake replicas may hold blocks from earlier tests: count from here on.
    predicted0 = counter(router, "predicted_hit_tokens", holder)
    reported0 = counter(router, "reported_cached_tokens", holder)
    for i in range(4):
        out = complete(router, base + prompt(100 + i, 9))
        assert out["choices"][0]["text"] == holder
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == len(base)
    predicted = counter(router, "predicted_hit_tokens", holder) - predicted0
    assert predicted == counter(router, "reported_cached_tokens", holder) - reported0 == 4 * len(base)


def test_burst_sharing_a_new_prefix_computes_it_once_per_replica_at_most(fakes, start_router):
    """cache_aware in seconds: a request behind its prefix's first computation waits for it where that is no
    later than computing the prefix elsewhere; the prefix is never computed twice on one replica."""
    router = start_router([f.spec for f in fakes])
    base = prompt(2, 200)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: complete(router, base + [i + 3] * 5), range(6)))
    misses = [o["choices"][0]["text"] for o in outs if o["usage"]["prompt_tokens_details"]["cached_tokens"] == 0]
    assert len(misses) == len(set(misses)) <= len(fakes)
    assert len(misses) < len(outs)


def test_streaming_is_passed_through_with_usage(fakes, start_router):
    router = start_router([f.spec for f in fakes])
    body = {"prompt": prompt(3), "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=20) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert text.rstrip().endswith("data: [DONE]")
    assert '"usage"' in text


def test_chat_requests_are_routed(fakes, start_router):
    router = start_router([f.spec for f in fakes])
    r = httpx.post(router.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}, timeout=20)
    assert r.status_code == 200, r.text


def test_metrics_show_decisions_stages_and_events(fakes, start_router):
    router = start_router([f.spec for f in fakes])
    complete(router, prompt(4))
    wait_for(lambda: router.runtime.router.events_applied > 0, what="events")
    text = httpx.get(router.url + "/metrics").text
    for name in ("kvmesh_router_decisions_total", "kvmesh_router_predicted_hit_tokens_total",
                 "kvmesh_router_reported_cached_tokens_total", 'kvmesh_router_routing_seconds_count{stage="tokenize"}',
                 'stage="hash"', 'stage="match"', 'stage="score"', "kvmesh_router_index_blocks",
                 "kvmesh_router_events_applied_total", "kvmesh_router_event_stream_total",
                 "kvmesh_router_event_lag_seconds", "kvmesh_router_replica_in_flight", "kvmesh_router_load_feed",
                 "kvmesh_router_replica_queued_prefill_tokens"):
        assert name in text, name
    from kvmesh.router.config import RouterConfig

    assert f'policy="{RouterConfig().policy}"' in text  # the default's name


def test_replicas_can_be_added_and_removed_at_runtime(fakes, start_router):
    router = start_router([], admin_key="admin-secret")
    admin = {"Authorization": "Bearer admin-secret"}
    assert httpx.get(router.url + "/health").status_code == 503
    spec = fakes[0].spec
    r = httpx.post(router.url + "/replicas", json={"url": spec.url, "events": spec.events, "replay": spec.replay,
                                                   "id": "a"}, headers=admin)
    assert r.status_code == 200 and r.json()["healthy"] is True
    assert httpx.get(router.url + "/health").status_code == 200
    assert complete(router, prompt(5))["choices"][0]["text"] == "a"
    assert httpx.delete(router.url + "/replicas/a", headers=admin).status_code == 200
    r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(5)})
    assert r.status_code == 503 and r.json()["error"]["code"] == 503


def test_re_registering_a_replica_with_new_endpoints_drops_its_tree(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec])
    core = router.runtime.router
    old = prompt(6)
    complete(router, old)
    wait_for(lambda: core.index.num_blocks("a") >= len(old) // BLOCK_SIZE, what="events from a")
    moved = b.spec
    moved.replica_id = "a"  # the cluster restarted replica "a" elsewhere: same id, new endpoints
    router.runtime.add_replica(moved)
    wait_for(lambda: "a" in core.healthy, what="the re-registered replica to be probed")
    # a batch of the old incarnation already on its way may land after the drop; the new incarnation's
    # snapshot (the subscriber asks for one on start) then clears it: wait for that, not for time
    wait_for(lambda: core.index.match(core.hasher.keys(old)).get("a", 0) == 0,
             what="the old incarnation's blocks to be gone")
    assert complete(router, prompt(7))["choices"][0]["text"] == "b"


def test_every_prompt_of_a_batch_is_checked_against_the_context_by_the_router(fakes, start_router, tokenizer):
    router = start_router([f.spec for f in fakes])
    too_long = prompt(9, tokenizer.max_model_len)
    r = httpx.post(router.url + "/v1/completions", json={"prompt": [prompt(8), too_long], "max_tokens": 2},
                   timeout=20)
    assert r.status_code == 400, r.text
    assert f"your prompt contains at least {len(too_long)} input tokens" in r.json()["error"]["message"]
    assert all(fake_stats(f)["auth_seen"] == [] for f in fakes)  # answered before any replica was asked


def test_a_batch_of_prompts_is_routed_by_its_first_prompt(fakes, start_router):
    router = start_router([f.spec for f in fakes])
    first, second = prompt(10), prompt(11, 20)
    raw = json.dumps({"prompt": [first, second], "max_tokens": 2}).encode()
    req, ids = asyncio.run(Forwarder(router.runtime.plane).reader.parse(raw, chat=False))
    assert ids == first and req.prompts() == [first, second]


def test_a_streamed_answer_carries_the_predicted_ttft_and_the_metric_compares_it_with_the_observed(fakes,
                                                                                                   start_router):
    for f in fakes:
        f.configure(prefill_tokens_per_s=10_000.0)  # measured rates reported in /load: the router prices in seconds
    try:
        router = start_router([f.spec for f in fakes])
        loads = router.runtime.router.loads.loads
        wait_for(lambda: all(load.prefill_tokens_per_s for load in loads.values()), what="/load polls")
        body = {"prompt": prompt(7, 200), "max_tokens": 2, "stream": True}
        with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=20,
                          headers={"x-kvmesh-receipt": "1"}) as r:
            assert r.status_code == 200
            predicted = float(r.headers["x-kvmesh-predicted-ttft-s"])
            "".join(r.iter_text())
        replica = r.headers["x-kvmesh-replica"]
        assert predicted == pytest.approx(200 / 10_000.0, rel=0.5)  # its prefill at the reported rate, and steps
        count = router.runtime.metrics.registry.get_sample_value("kvmesh_router_ttft_actual_over_predicted_count",
                                                                 {"replica": replica})
        assert count == 1
        assert loads[replica].ttft_sums  # the router learned from it
    finally:
        for f in fakes:
            f.configure(prefill_tokens_per_s=0.0)
