"""A routed prompt's prediction held until its replica's first bytes (``RouterConfig.predict_hold_s``): a request
sharing a prompt still queued or computed past ``predict_ttl_s`` goes to its holder; released, the prediction lasts
``predict_ttl_s`` more; a request that never answers leaves none behind."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from kvmesh.router.config import RouterConfig, build_router

BS = 4
PROMPT = list(range(100, 140))  # 10 blocks


def two_replicas(hold_s: float):
    router = build_router(RouterConfig(block_size=BS, predict_ttl_s=1.0, predict_hold_s=hold_s), seed=0)
    for rid in ("a", "b"):
        router.add_replica(rid)
    return router


def test_a_prompt_still_computed_past_the_ttl_keeps_the_next_request_that_shares_it():
    held, plain = two_replicas(30.0), two_replicas(0.0)
    for router in (held, plain):
        first = router.route(PROMPT, now=100.0)
        second = router.route(PROMPT, now=105.0)  # the first prompt is still being computed
        assert (second.replica_id == first.replica_id) == (router is held)
        assert second.matched_blocks == (10 if router is held else 0)


def test_released_at_the_first_bytes_it_lasts_the_ttl_more():
    router = two_replicas(30.0)
    first = router.route(PROMPT, now=100.0)
    assert first.prediction is not None
    router.release_prediction(first, now=106.0)
    assert first.prediction is None
    assert router.index.match(router.hasher.keys(PROMPT), now=106.9) == {first.replica_id: 10}
    assert router.index.match(router.hasher.keys(PROMPT), now=107.1) == {}
    router.release_prediction(first, now=108.0)  # twice (the first bytes, then the attempt's end): harmless
    assert router.index.match(router.hasher.keys(PROMPT), now=108.1) == {}


def test_a_decision_priced_but_not_committed_holds_nothing_until_it_is():
    router = two_replicas(30.0)
    decision = router.route(PROMPT, now=100.0, commit=False)
    assert decision.prediction is None and not router.index.predictions.held
    router.commit(decision, now=100.5)
    assert decision.prediction is not None and router.index.predictions.held


def test_a_request_that_never_answers_leaves_no_prediction_past_its_backstop():
    router = two_replicas(30.0)
    for i in range(50):  # fifty prompts routed, none answered
        router.route([7 + i] + PROMPT, now=100.0)
    assert len(router.index.predictions.held) == 50
    assert router.index.match(router.hasher.keys([7] + PROMPT), now=130.1) == {}
    assert not router.index.predictions.held and router.index.num_blocks() == 0


@pytest.mark.parametrize("hold_s", [0.0, 30.0])
def test_live_a_request_sharing_a_prompt_still_computed_goes_to_its_holder_only_while_held(hold_s, fakes,
                                                                                         start_router):
    """Through the HTTP router: the first request's replica waits 3 s before computing anything (its prompt queued
    or computed), the second comes 1 s in, past ``predict_ttl_s`` (0.5 s). Held, it follows the first; plain, the
    prediction is gone and it goes by load to the other replica."""
    a, b = fakes
    router = start_router([a.spec, b.spec], predict_ttl_s=0.5, predict_hold_s=hold_s)
    for fake in fakes:
        fake.configure(delay=3.0)
    prompt = list(range(300, 364) if hold_s else range(200, 264))  # the fakes are the session's: a prompt each
    headers = {"x-kvmesh-receipt": "1"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.post, router.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                            headers=headers, timeout=20)
        time.sleep(1.0)
        second = pool.submit(httpx.post, router.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                             headers=headers, timeout=20)
        one, two = first.result(), second.result()
    assert one.status_code == two.status_code == 200
    same = one.headers["x-kvmesh-replica"] == two.headers["x-kvmesh-replica"]
    assert same == (hold_s > 0), (one.headers, two.headers)
    assert not router.runtime.router.index.predictions.held  # both answered: released


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_hold_that_is_negative_endless_or_not_a_number_is_refused(bad):
    with pytest.raises(ValueError, match="predict_hold_s must be finite seconds >= 0"):
        RouterConfig(predict_hold_s=bad)
