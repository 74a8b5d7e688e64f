"""The router in front of two live kvmesh replicas serving stories260K (real engine, real events).

- router and replica compute the same keys for completions and chat, with and without cache_salt;
  a salted request never matches an unsalted prefix;
- requests sharing a prefix go to the replica holding it, which reports the cached tokens the
  router predicted, until that replica's load outweighs the saved prefill.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.http.proxy import Forwarder
from kvmesh.router.routing.candidates import Candidates

from .conftest import ADMIN_KEY, replica_rows, wait_for

pytestmark = pytest.mark.slow

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog in the park and the dog wanted to play with the ball too. "
         "Lily was happy to share, and they played together until the sun went down.")


@pytest.fixture(scope="module")
def live(stories_path, tokenizer):
    from kvmesh.kvcache.hashing import cache_salt_secret, generate_seed
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    from ..conftest import CHAT_TEMPLATE

    runtimes = []
    seed = generate_seed()  # one cluster: one seed; the router gets only the salt secret derived from it
    try:
        for _ in range(2):
            config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=32,
                                  hash_seed=seed)
            runtimes.append(ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=0, replay_port=0),
                                                 frontend=FrontendConfig(chat_template=CHAT_TEMPLATE)))
        specs = [ReplicaSpec(rt.http.url, rt.endpoints()["events_endpoint"], rt.endpoints()["replay_endpoint"],
                             replica_id=f"live{i}") for i, rt in enumerate(runtimes)]
        router = RouterServer(RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.2),
                                           admin_key=ADMIN_KEY,
                                           cache_salt_secret=cache_salt_secret(seed)), specs,
                              tokenizer=tokenizer).start()
        wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
        yield router
        router.stop()
    finally:
        for rt in runtimes:
            rt.shutdown(graceful_s=0.5)


def post(router, path, body):
    r = httpx.post(router.url + path, json={"max_tokens": 3, "temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def router_keys(router, path, body):
    req, ids = asyncio.run(Forwarder(router.runtime.plane).reader.parse(json.dumps(body).encode(), chat="chat" in path))
    return router.runtime.router.hasher.keys(ids, req.cache_salt)


def holders(router, keys):
    """Replicas that hold every one of ``keys`` according to their real events (no predictions)."""
    index = router.runtime.router.index
    with router.runtime.router.lock:
        index.predictions.expire(float("inf"))
        return {rid for rid, n in index.match(keys).items() if n == len(keys)}


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": STORY}),
    ("/v1/completions", {"prompt": STORY + " The end.", "cache_salt": "tenant-1"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": STORY}]}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be kind."},
                                           {"role": "user", "content": STORY}], "cache_salt": "tenant-2"}),
])
def test_router_keys_equal_the_blocks_the_replica_stored(live, path, body):
    keys = router_keys(live, path, body)
    assert len(keys) >= 4
    post(live, path, body)
    wait_for(lambda: len(holders(live, keys)) == 1, what="the replica's BlockStored events")


def test_salted_request_never_matches_unsalted_prefix(live):
    body = {"prompt": STORY + " Salt test."}
    post(live, "/v1/completions", body)
    plain = router_keys(live, "/v1/completions", body)
    wait_for(lambda: holders(live, plain), what="events")
    salted = router_keys(live, "/v1/completions", {**body, "cache_salt": "other-tenant"})
    assert not set(plain) & set(salted)
    assert live.runtime.router.index.match(salted) == {}
    out = post(live, "/v1/completions", {**body, "cache_salt": "other-tenant"})
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


PINNED_PREFILL_TOKENS_PER_S = 2_000.0
"""The prefill rate both replicas are priced with in the decision test (a slow GPU's, so a cached block is worth
milliseconds): what each replica measured of itself on this machine is left out, so the test asserts the decision
the cost makes from its inputs, whatever the machine's speed."""


@pytest.fixture
def pinned_rates(live, monkeypatch):
    """Both replicas priced with the same injected rates: their reports keep everything but the measured rates
    (prefill rate pinned, decode step unmeasured), and no observed TTFT corrects a prediction."""
    from kvmesh.router.replicas.load import ReplicaLoad
    from kvmesh.router.routing import crediting

    report = ReplicaLoad.update_report

    def pinned(self, r):
        report(self, r)
        self.prefill_tokens_per_s, self.decode_step = PINNED_PREFILL_TOKENS_PER_S, None

    monkeypatch.setattr(ReplicaLoad, "update_report", pinned)
    monkeypatch.setattr(crediting, "observe_ttft", lambda load, raw_s, actual_s: None)
    core = live.runtime.router
    with core.lock:
        for load in core.loads.loads.values():
            load.prefill_tokens_per_s, load.decode_step = PINNED_PREFILL_TOKENS_PER_S, None
            load.ttft_correction, load.ttft_offset_s = 1.0, 0.0
            load.ttft_sums.clear()


def test_shared_prefix_goes_to_holder_until_its_load_outweighs_the_saved_prefill(live, pinned_rates):
    core, metrics = live.runtime.router, live.runtime.metrics
    base = " ".join([STORY] * 4) + " Then Lily went home and"
    post(live, "/v1/completions", {"prompt": base})
    base_keys = router_keys(live, "/v1/completions", {"prompt": base})
    wait_for(lambda: holders(live, base_keys), what="events")
    (holder,) = holders(live, base_keys)
    other = next(r for r in core.healthy if r != holder)
    sample = lambda name: metrics.registry.get_sample_value(name, {"replica": holder}) or 0  # noqa: E731
    pred0 = sample("kvmesh_router_predicted_hit_tokens_total")
    rep0 = sample("kvmesh_router_reported_cached_tokens_total")
    for ending in (" ate dinner.", " slept well.", " read a book."):
        out = post(live, "/v1/completions", {"prompt": base + ending})
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * len(base_keys) - 16
    predicted = sample("kvmesh_router_predicted_hit_tokens_total") - pred0
    reported = sample("kvmesh_router_reported_cached_tokens_total") - rep0
    assert predicted == reported > 0

    # The holder gets busy: as many running requests as it takes for its price to outweigh the other
    # replica's, and four more. The count comes from the policy's own prices (router/routing/cost/).
    saved = 16 * len(base_keys)
    busy = core.loads.loads[holder]
    keys = router_keys(live, "/v1/completions", {"prompt": base + " played chess."})

    def costs() -> dict:
        with core.lock:
            priced = core.policy.price(keys, core.index.match_tiers(keys),
                                       Candidates.of([core.replicas.get(r) for r in (holder, other)]))
        return {r: e.choice_s for r, e in priced.items()}

    assert costs()[holder] < costs()[other]  # idle, the holder's cached prefix made it the cheaper
    extra = 0
    while costs()[holder] <= costs()[other] and extra < 100_000:
        busy.in_flight += 1
        extra += 1
    busy.in_flight += 4
    extra += 4
    busy.in_flight += extra
    decisions = lambda: metrics.registry.get_sample_value(  # noqa: E731
        "kvmesh_router_decisions_total", {"replica": other, "policy": core.policy.name}) or 0
    other_sample = lambda name: metrics.registry.get_sample_value(name, {"replica": other}) or 0  # noqa: E731
    before = decisions()
    pred0 = other_sample("kvmesh_router_predicted_hit_tokens_total")
    try:
        out = post(live, "/v1/completions", {"prompt": base + " played chess."})
        retried = metrics.registry.get_sample_value("kvmesh_router_retries_total", {"replica": other}) or 0
        assert decisions() == before + 1, (  # what the router saw, should this ever fail again
            f"routed to the holder: healthy={sorted(core.healthy)} retries on other={retried} "
            f"holder={core.loads.loads[holder]!r} other={core.loads.loads[other]!r}")
        cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == other_sample("kvmesh_router_predicted_hit_tokens_total") - pred0
        assert cached < saved
    finally:
        busy.in_flight -= extra


def test_route_receipts_predict_what_the_engine_reports_and_hold_sessions(live):
    """Route receipts, live: with ``x-kvmesh-receipt`` every response says where it went and why, and
    what the router predicted is the engine's ``cached_tokens`` on (almost) every request."""
    stems = [STORY, STORY.replace("Lily", "Tom"), "One day a little dog found a big red ball in the garden and"]
    agree = total = 0
    for turn in range(6):
        for i, stem in enumerate(stems):
            r = httpx.post(live.url + "/v1/completions", timeout=60,
                           headers={"x-kvmesh-receipt": "1", "x-session-id": f"conversation-{i}"},
                           json={"prompt": stem + " and then" * (turn + 1), "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.headers["x-kvmesh-replica"] in live.runtime.router.healthy
            assert r.headers["x-kvmesh-route-reason"] in ("cache", "load", "session", "fallback")
            predicted = int(r.headers["x-kvmesh-predicted-hit-tokens"])
            assert int(r.headers["x-kvmesh-best-hit-tokens"]) >= predicted
            agree += predicted == r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            total += 1
    assert agree >= 0.95 * total, f"predicted == cached_tokens on {agree} of {total} requests"
    summary = live.runtime.router.receipts.summary()["cluster"]
    assert summary["requests"] >= total and summary["mispredicted_rate"] <= 0.05
    no_receipt = httpx.post(live.url + "/v1/completions", timeout=60, json={"prompt": STORY, "max_tokens": 1})
    assert "x-kvmesh-replica" not in no_receipt.headers  # opt-in only


@pytest.mark.parametrize("mismatch", ["block_size", "chat_template"])
def test_replica_that_cannot_match_the_router_keys_is_degraded_not_matched(live, stories_path, mismatch):
    """A replica with another block size or chat template (tokenizer fingerprint) is routed by load only,
    visible in /replicas, instead of being matched with keys that can never hit."""
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    from ..conftest import CHAT_TEMPLATE

    template = CHAT_TEMPLATE if mismatch == "block_size" else CHAT_TEMPLATE.replace(": ", ":: ")
    config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8,
                          block_size=32 if mismatch == "block_size" else 16)
    runtime = ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=0, replay_port=0),
                                   frontend=FrontendConfig(chat_template=template))
    router_rt = live.runtime
    try:
        e = runtime.endpoints()
        spec = ReplicaSpec(runtime.http.url, e["events_endpoint"], e["replay_endpoint"], replica_id="odd")
        router_rt.add_replica(spec)
        wait_for(lambda: "odd" in router_rt.router.healthy, what="the odd replica probed")
        reason = router_rt.router.degraded.get("odd")
        assert reason is not None and ("block size" if mismatch == "block_size" else "fingerprint") in reason
        listed = {r["id"]: r for r in replica_rows(live)}
        assert listed["odd"]["degraded"]
        healthy_ones = [r for r in router_rt.router.healthy if r != "odd"]
        assert all(r not in router_rt.router.degraded for r in healthy_ones)
    finally:
        router_rt.remove_replica("odd")
        runtime.shutdown(graceful_s=0.5)
