"""The load weight learned from the queue's tail (router/routing/queue_tail.py, ``CacheAwareTokensConfig.tail_knee``):
the waits a router measures (a request's TTFT less its own predicted work) against the requests' targets lift the
weight of queued prefill from ``backlog_weight`` towards ``tail_weight``; unpriced or absurd observations teach
nothing, and a flood of them cannot push the weight past its bounds."""

from __future__ import annotations

import math

import pytest
from kvmesh.replica.serving.load_report import DecodeStepLoad, LoadReport
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.config import RouterConfig, build_router
from kvmesh.router.routing.cost.estimate import TTFTEstimate
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensConfig
from kvmesh.router.routing.queue_tail import QueueTail
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates
from .test_policies import BS, KEYS, loads


def priced(prefill_s: float, queue_s: float = 0.0, priced: bool = True) -> TTFTEstimate:
    """An estimate whose own work is ``prefill_s`` and whose predicted wait is ``queue_s``."""
    return TTFTEstimate(queue_s=queue_s, interleave_s=0.0, prefill_s=prefill_s, load_back_s=0.0, pull_s=0.0,
                        adapter_s=0.0, stall_s=0.0, pace_s=0.01, priced=priced)


def test_waits_under_the_knee_lift_nothing_and_waits_at_the_target_lift_fully():
    tail = QueueTail(knee=0.5, window=32)
    for _ in range(32):
        tail.observe(priced(0.1), 0.1 + 0.4, target_s=1.0)  # waited 0.4 s of a 1 s target
    assert tail.tail == pytest.approx(0.4) and tail.lift == 0.0 and tail.weight(0.15, 1.0) == 0.15
    for _ in range(32):
        tail.observe(priced(0.1), 0.1 + 0.75, target_s=1.0)  # halfway from the knee to the target
    assert tail.lift == pytest.approx(0.5) and tail.weight(0.15, 1.0) == pytest.approx(0.575)
    assert tail.weight(0.15, 0.5) == pytest.approx(0.325)  # towards tail_weight, not 1
    for _ in range(32):
        tail.observe(priced(0.1), 0.1 + 3.0, target_s=1.0)
    assert tail.lift == 1.0 and tail.weight(0.15, 1.0) == 1.0


def test_a_long_prompt_computing_for_its_whole_target_counts_no_wait():
    tail = QueueTail(knee=0.1, window=16)
    for _ in range(16):
        tail.observe(priced(prefill_s=2.5), 2.5, target_s=2.0)  # its own prefill alone misses the target
    assert tail.tail == 0.0 and tail.lift == 0.0


def test_the_target_is_the_requests_own():
    short, long = QueueTail(knee=0.5, window=8), QueueTail(knee=0.5, window=8)
    for _ in range(8):
        short.observe(priced(0.1), 1.1, target_s=1.0)
        long.observe(priced(0.1), 1.1, target_s=10.0)
    assert short.lift == 1.0 and long.lift == 0.0


def test_past_the_overload_point_the_weight_falls_back():
    tail = QueueTail(knee=0.1, window=8, overload=2.0)
    for _ in range(8):
        tail.observe(priced(0.0), 1.5, target_s=1.0)
    assert tail.lift == pytest.approx(0.5)
    for _ in range(8):
        tail.observe(priced(0.0), 5.0, target_s=1.0)
    assert tail.lift == 0.0


def test_unpriced_and_absurd_observations_teach_nothing_and_a_flood_stays_bounded():
    tail = QueueTail(knee=0.5, window=16)
    for actual, target, estimate in ((math.nan, 1.0, priced(0.1)), (math.inf, 1.0, priced(0.1)),
                                     (5.0, 0.0, priced(0.1)), (5.0, -1.0, priced(0.1)), (5.0, math.nan, priced(0.1)),
                                     (5.0, 1.0, None), (5.0, 1.0, priced(0.1, priced=False))):
        tail.observe(estimate, actual, target)
    assert not tail.ratios and tail.lift == 0.0
    for _ in range(10_000):  # a tenant whose requests all wait absurdly long: the weight stops at its top
        tail.observe(priced(0.0), 1e12, target_s=1e-9)
        tail.observe(priced(0.0), -5.0, target_s=1.0)  # answered "before" it was routed: no wait, not a credit
    assert len(tail.ratios) == 16 and 0.0 <= tail.lift <= 1.0
    assert tail.weight(0.15, 0.5) <= 0.5
    with pytest.raises(ValueError, match="tail_knee"):
        QueueTail(knee=1.0)
    with pytest.raises(ValueError, match="tail_knee must be in"):
        CacheAwareTokensConfig(tail_knee=-0.1)
    with pytest.raises(ValueError, match="tail_weight"):
        CacheAwareTokensConfig(tail_knee=0.1, tail_weight=math.inf)
    with pytest.raises(ValueError, match="tail_overload"):
        CacheAwareTokensConfig(tail_knee=0.1, tail_overload=1.0)


def test_a_lifted_weight_sends_a_request_past_its_holders_queue():
    """r1 holds 40 of the prompt's 64 blocks behind 2,000 queued prompt tokens; r0 is idle and holds nothing. At
    ``backlog_weight`` 0.15 the hit wins (384 + 300 < 1024); once the measured waits reach the target, a queued
    token weighs as a computed one and r0 computes it sooner (384 + 2000 > 1024)."""
    config = CacheAwareTokensConfig(decode_weight=0, tail_knee=0.5, tail_window=8)
    policy = get_policy("cache_aware_tokens", config, block_size=BS)
    fleet = loads(2, r1={"queued_prefill_tokens": 2000})
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(fleet)).id == "r1"
    for _ in range(8):
        policy.observe_ttft(priced(0.1), 1.2, target_s=1.0)
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(fleet)).id == "r0"
    off = get_policy("cache_aware_tokens", CacheAwareTokensConfig(decode_weight=0), block_size=BS)
    for _ in range(8):
        off.observe_ttft(priced(0.1), 1.2, target_s=1.0)  # without tail_knee nothing is learned
    assert off.choose(KEYS, TierMatches({"r1": 40}), candidates(fleet)).id == "r1"


def test_the_router_teaches_its_policy_against_its_target_or_the_requests():
    step = DecodeStepLoad(step_s=0.008, s_per_seq=5e-5, s_per_context_token=4e-8)
    section = RouterConfig(policy_kwargs={"tail_knee": 0.5, "tail_window": 4}, predict_ttl_s=0.0,
                           admission=AdmissionConfig(ttft_target_s=2.0))
    router = build_router(section, seed=1)
    router.add_replica("a")
    router.loads.loads["a"].update_report(LoadReport(num_requests_running=0, num_requests_waiting=0,
                                                     kv_cache_usage=0.0, num_waiting_prefill_tokens=0,
                                                     prefill_tokens_per_s=8_000.0, decode_step=step))
    tail = router.policy.tail
    decision = router.route(list(range(64)))
    own = decision.estimate.prefill_s
    for _ in range(4):
        router.observe_ttft(decision, own + 1.0)  # a 1 s wait against the router's 2 s target
    assert tail.tail == pytest.approx(0.5)
    for _ in range(4):
        router.observe_ttft(decision, own + 1.0, target_s=1.0)  # a priority class's 1 s deadline
    assert tail.tail == pytest.approx(1.0) and tail.lift == 1.0
    assert build_router(RouterConfig(), seed=1).ttft_target_s == 1.0
    with pytest.raises(ValueError, match="ttft_target_s"):
        AdmissionConfig(ttft_target_s=0.0)
