"""The router's cost in seconds (router/routing/cost/): one predicted time per candidate, from what each replica
measured of itself; priors from the fleet for what it has not; the online correction; ``cache_aware`` choosing by
it; the replica's decode step-time fit (replica/engine/step_time.py) and its /load fields."""

from __future__ import annotations

import dataclasses
import math
import random

import msgspec
import pytest
from kvmesh.replica.engine.step_time import DecodeStepTime, LinearFit, decode_step_load
from kvmesh.replica.serving.load_report import DecodeStepLoad, LoadReport, LoRALoad
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost import FleetRates, PullPriors, estimate, observe_ttft, price_all, pull_seconds
from kvmesh.router.routing.cost.correction import BOUNDS
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import LAYOUT, candidates

BS = 16
KEYS = list(range(64))  # a 1,024-token prompt
STEP = DecodeStepLoad(step_s=0.008, s_per_seq=5e-5, s_per_context_token=4e-8)


def replica(rate=10_000.0, **fields) -> ReplicaLoad:
    load = ReplicaLoad(prefill_tokens_per_s=rate, decode_step=STEP)
    for k, v in fields.items():
        setattr(load, k, v)
    return load


def test_the_estimate_is_the_sum_of_its_parts_in_seconds():
    load = replica(queued_prefill_tokens=5_000, num_running=4, kv_block_bytes=1 << 20, h2d_bytes_per_s=2e10,
                   decode_step=DecodeStepLoad(step_s=0.008, s_per_seq=5e-5, s_per_context_token=4e-8,
                                              context_tokens=40_000))
    e = estimate(load, FleetRates(), 1024, 400, 10, BS, step_tokens=2048)
    assert e.queue_s == pytest.approx(0.5) and e.prefill_s == pytest.approx(0.04)
    steps = math.ceil((5_000 + 400) / 2048)  # the batch's decode steps interleaved until our first token
    assert e.interleave_s == pytest.approx(steps * (0.008 + 4 * 5e-5 + 40_000 * 4e-8))
    assert e.load_back_s == pytest.approx(10 * (1 << 20) / 2e10)
    assert e.ttft_s == pytest.approx(e.queue_s + e.interleave_s + e.prefill_s + e.load_back_s)
    assert e.stall_s == pytest.approx(4 * 0.04)  # its prefill delays the four decodes there
    assert e.pace_s == pytest.approx(0.008 + 5 * 5e-5 + (40_000 + 1024) * 4e-8)
    assert e.priced


def test_an_unmeasured_rate_is_the_slowest_the_fleet_measured_never_zero():
    fast, slow, new = replica(20_000.0), replica(5_000.0), ReplicaLoad()
    fleet = FleetRates.of([fast, slow, new])
    assert fleet.prefill_s_per_token == pytest.approx(1 / 5_000)
    e = estimate(new, fleet, 1024, 1024, 0, BS, 8192)
    assert e.priced and e.prefill_s == pytest.approx(1024 / 5_000)
    nobody = estimate(ReplicaLoad(), FleetRates(), 1024, 1024, 0, BS, 8192)
    assert not nobody.priced and nobody.prefill_s == 1024  # unit rates: candidates still compare
    # no replica measured a decode step: a decode row costs one prompt token, not 0
    no_step = estimate(ReplicaLoad(prefill_tokens_per_s=1000.0, num_running=3), FleetRates(), 16, 16, 0, BS, 8192)
    assert no_step.interleave_s == pytest.approx(3 / 1000)


def test_a_pull_is_bytes_over_the_measured_rate_plus_the_measured_fixed_cost_else_the_priors():
    load = replica(kv_transfer_enabled=True, kv_block_bytes=1 << 20, pull_bytes_per_s=1e10, pull_fixed_s=0.003)
    priors = PullPriors(True, 1e9, 0.01)
    assert pull_seconds(load, FleetRates(), 8, BS, priors) == pytest.approx(8 * (1 << 20) / 1e10 + 0.003)
    unmeasured = replica(kv_transfer_enabled=True, kv_block_bytes=1 << 20)
    assert pull_seconds(unmeasured, FleetRates(), 8, BS, priors) == pytest.approx(8 * (1 << 20) / 1e9 + 0.01)
    fleet = FleetRates.of([load, unmeasured])  # the fleet measured one: that, not the prior
    assert pull_seconds(unmeasured, fleet, 8, BS, priors) == pytest.approx(8 * (1 << 20) / 1e10 + 0.003)


def test_an_adapter_not_resident_costs_its_size_over_the_measured_load_rate():
    lora = LoRALoad(enabled=True, adapters={"tiny": 4_000_000, "hot": 4_000_000}, resident=["hot"],
                    load_bytes_per_s=2e9)
    load = replica(lora=lora)
    assert estimate(load, FleetRates(), 64, 64, 0, BS, 8192, lora_name="tiny").adapter_s == pytest.approx(0.002)
    assert estimate(load, FleetRates(), 64, 64, 0, BS, 8192, lora_name="hot").adapter_s == 0.0
    assert estimate(load, FleetRates(), 64, 64, 0, BS, 8192).adapter_s == 0.0  # the base model


def test_price_all_pulls_only_where_the_pull_beats_computing():
    holder = replica(kv_transfer_enabled=True, kv_block_bytes=1 << 20, pull_bytes_per_s=1e10, pull_fixed_s=0.001,
                     queued_prefill_tokens=50_000)
    idle = replica(kv_transfer_enabled=True, kv_block_bytes=1 << 20, pull_bytes_per_s=1e10, pull_fixed_s=0.001)
    loads = {"h": holder, "i": idle}
    priced = price_all(loads, {"h": 60}, {}, 1024, BS, 8192, PullPriors(True, None, 0.0))
    assert priced["i"].pulled_blocks == 60 and priced["i"].own_tokens == 1024 - 60 * BS
    assert priced["i"].pull_s == pytest.approx(60 * (1 << 20) / 1e10 + 0.001)
    no_pulls = price_all(loads, {"h": 60}, {}, 1024, BS, 8192, PullPriors(False, None, 0.0))
    assert no_pulls["i"].pulled_blocks == 0 and no_pulls["i"].own_tokens == 1024
    idle.pull_bytes_per_s = 1e6  # slower than computing: no pull
    assert price_all(loads, {"h": 60}, {}, 1024, BS, 8192, PullPriors(True, None, 0.0))["i"].pulled_blocks == 0


def test_the_correction_learns_an_offset_and_a_scale_and_stays_bounded():
    load, rng = ReplicaLoad(), random.Random(1)
    for _ in range(200):
        raw = rng.uniform(0.01, 0.2)
        observe_ttft(load, raw, 0.004 + 1.5 * raw)  # a fixed overhead the estimate misses, a rate 1.5x off
    assert load.ttft_offset_s == pytest.approx(0.004, rel=1e-3) and load.ttft_correction == pytest.approx(1.5)
    load.prefill_tokens_per_s = 1000.0
    assert estimate(load, FleetRates(), 100, 100, 0, BS, 8192).ttft_s == pytest.approx(0.004 + 1.5 * 0.1)
    same = ReplicaLoad()
    for _ in range(100):
        observe_ttft(same, 0.1, 0.2)  # one prediction only: offset and scale cannot be told apart -> the ratio
    assert same.ttft_offset_s == 0.0 and same.ttft_correction == pytest.approx(2.0)
    for _ in range(200):
        observe_ttft(same, 0.1, 100.0)  # an outlier streak cannot make it unusable
    assert same.ttft_correction == pytest.approx(BOUNDS[1])
    observe_ttft(same, 0.0, 1.0)  # nothing priced: nothing learned
    assert same.ttft_correction == pytest.approx(BOUNDS[1])


def test_cache_aware_chooses_the_smallest_predicted_time():
    policy = get_policy("cache_aware", block_size=BS)
    rng = random.Random(3)
    for _ in range(100):
        loads = {f"r{i}": replica(rng.uniform(2_000, 20_000), queued_prefill_tokens=rng.randrange(20_000),
                                  num_running=rng.randrange(30)) for i in range(6)}
        matches = {f"r{i}": rng.randrange(65) for i in range(6) if rng.random() < 0.5}
        choice = policy.decide(KEYS, TierMatches(matches), candidates(loads))
        cost = {rid: e.choice_s for rid, e in choice.prices.items()}
        assert cost[choice.replica.id] == pytest.approx(min(cost.values()))
        assert choice.estimate is choice.prices[choice.replica.id]


def test_cache_aware_leaves_its_prefix_once_the_queue_costs_more_seconds_than_the_hit_saves():
    policy = get_policy("cache_aware", block_size=BS)
    saved_s = 40 * BS / 10_000
    near = {"r0": replica(), "r1": replica(queued_prefill_tokens=int(0.9 * saved_s * 10_000))}
    far = {"r0": replica(), "r1": replica(queued_prefill_tokens=int(1.1 * saved_s * 10_000))}
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(near)).id == "r1"
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(far)).id == "r0"
    slow_hit = {"r0": replica(), "r1": replica(rate=1_000.0)}  # a hit on a 10x slower replica: not worth it
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(slow_hit)).id == "r0"


def test_the_router_reports_the_prediction_and_learns_from_the_observed_ttft():
    router = KVRouter(block_size=BS, predict_ttl_s=0.0)
    for rid in ("a", "b"):
        router.add_replica(rid)
        router.loads.loads[rid].update_report(LoadReport(num_requests_running=0, num_requests_waiting=0,
                                                         kv_cache_usage=0.0, num_waiting_prefill_tokens=0,
                                                         prefill_tokens_per_s=8_000.0, decode_step=STEP))
    decision = router.route(list(range(1024)))
    assert decision.predicted_ttft_s == pytest.approx(decision.estimate.ttft_s) and decision.predicted_ttft_s > 0
    assert decision.receipt.predicted_ttft_s == decision.predicted_ttft_s
    assert decision.receipt.log_fields()["predicted_pace_s"] == pytest.approx(0.008 + 5e-5 + 1024 * 4e-8)
    router.observe_ttft(decision, 2 * decision.predicted_ttft_s)
    assert router.loads.loads[decision.replica_id].ttft_correction > 1.0
    assert decision.receipt.log_fields()["ttft_s"] == pytest.approx(2 * decision.predicted_ttft_s)
    baseline = KVRouter(block_size=BS, policy=get_policy("least_loaded"), predict_ttl_s=0.0)  # priced as well
    baseline.add_replica("a")
    assert baseline.route(list(range(64))).predicted_ttft_s is None  # no rate anywhere: unknown, not 0
    baseline.loads.loads["a"].prefill_tokens_per_s = 1000.0
    assert baseline.route(list(range(64))).predicted_ttft_s == pytest.approx(64 / 1000)


def test_the_decode_step_fit_recovers_its_coefficients_and_never_goes_negative():
    fit, rng = DecodeStepTime(), random.Random(0)
    for _ in range(300):
        batch = rng.randint(1, 64)
        context = batch * rng.randint(100, 4000)
        fit.record(batch, context, 0.008 + 5e-5 * batch + 4e-8 * context)
    assert fit.coefficients() == pytest.approx((0.008, 5e-5, 4e-8), rel=1e-4)
    same = DecodeStepTime()  # one batch shape only: slopes undetermined, the mean step is the intercept
    for _ in range(20):
        same.record(4, 400, 0.01)
    assert same.coefficients() == pytest.approx((0.01, 0.0, 0.0))
    pull = LinearFit(1)  # a pull's seconds against its bytes: the intercept is its fixed cost
    for i in range(30):
        nbytes = (i % 3 + 1) * 1e6
        pull.record(0.002 + nbytes / 2e9, nbytes)
    assert pull.coefficients() == pytest.approx([0.002, 1 / 2e9], rel=1e-6)


def test_load_reports_the_decode_step_fit_and_the_pull_fixed_cost():
    class Running:
        num_computed_tokens = 300

    fit = DecodeStepTime()
    assert decode_step_load(fit, [Running()]) == DecodeStepLoad(context_tokens=300)  # not measured yet
    for batch in (1, 2, 3, 4):
        fit.record(batch, 100 * batch, 0.01 + 0.001 * batch)
    report = LoadReport(num_requests_running=2, num_requests_waiting=0, kv_cache_usage=0.0,
                        num_waiting_prefill_tokens=0, decode_step=decode_step_load(fit, [Running(), Running()]))
    wire = msgspec.json.decode(msgspec.json.encode(report))
    assert wire["decode_step"]["step_s"] == pytest.approx(0.01) and wire["decode_step"]["context_tokens"] == 600
    assert wire["kv_transfer"]["pull_fixed_s"] is None
    load = ReplicaLoad()
    load.update_report(msgspec.json.decode(msgspec.json.encode(report), type=LoadReport))
    load.update_transfer({"enabled": True, "pull_bytes_per_s": 1e9, "pull_fixed_s": 0.004, "layout": LAYOUT})
    assert load.decode_step.step_s == pytest.approx(0.01) and load.pull_fixed_s == 0.004


def test_the_wait_part_of_a_prediction_leaves_out_the_requests_own_work_and_follows_the_correction():
    from kvmesh.router.routing.cost import TTFTEstimate

    e = TTFTEstimate(queue_s=0.2, interleave_s=0.1, prefill_s=1.5, load_back_s=0.1, pull_s=0.05, adapter_s=0.05,
                     stall_s=0.0, pace_s=0.01)
    assert e.ttft_s == pytest.approx(2.0) and e.wait_s == pytest.approx(0.3)  # a long prompt behind a short queue
    slower = dataclasses.replace(e, corrected_s=3.0)  # the replica runs 1.5x slower than predicted: its wait too
    assert slower.wait_s == pytest.approx(0.45)
