"""The price's terms (router/routing/cost/terms.py), written once, against cases computed by hand: each case is
priced one replica at a time (floats) and every replica at once (the load columns' arrays), and both must give the
hand-computed seconds. Hostile inputs included: rates that are NaN, infinite, zero or negative (not measured: the
fleet's prior prices them), decode fits that are not numbers, loads of 2**62 tokens, a fleet that measured nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kvmesh.replica.serving.load_report import DecodeStepLoad, LoRALoad
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing import routable
from kvmesh.router.routing.cost import FleetRates, PullPriors, price_all
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.cost.ops import ARRAY, SCALAR
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates

BS = 16
MIB = 1 << 20
STEP = DecodeStepLoad(step_s=0.008, s_per_seq=5e-5, s_per_context_token=4e-8, context_tokens=40_000)
NOT_RATES = (None, 0.0, -5.0, math.nan, math.inf)


@pytest.fixture(autouse=True)
def columns_at_any_size(monkeypatch):
    monkeypatch.setattr(routable, "COLUMNS_FROM", 1)


def load(**fields) -> ReplicaLoad:
    out = ReplicaLoad()
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def both_ways(loads: dict[str, ReplicaLoad], device: dict, host: dict, prompt: int, step_tokens: float = 2048.0,
              pulls: PullPriors | None = None, lora: str | None = None):
    """``price_all`` of ``loads`` one by one (a plain dict) and in one pass over the columns (a router's)."""
    router = KVRouter(block_size=BS)
    for rid, src in loads.items():
        router.add_replica(rid)
        dst = router.loads.loads[rid]
        for name in ReplicaLoad.__dataclass_fields__:
            if name not in ("watcher", "row", "shared_slot"):
                setattr(dst, name, getattr(src, name))
    with router.lock:
        columns = router.candidates(set()).loads
    assert type(columns) is CandidateLoads
    return [price_all(given, device, host, prompt, BS, step_tokens, pulls, lora) for given in (loads, columns)]


def test_every_term_of_a_busy_replica_with_a_host_tier_is_the_hand_computed_one():
    busy = load(prefill_tokens_per_s=10_000.0, queued_prefill_tokens=5_000, num_running=4, decode_step=STEP,
                kv_block_bytes=MIB, h2d_bytes_per_s=2e10, arrival_rate=0.5, ttft_correction=2.0, ttft_offset_s=0.01,
                recent_prompt=1000.0, recent_prefill=250.0)
    for prices in both_ways({"a": busy}, {"a": 20}, {"a": 30}, 1024):
        e = prices["a"]
        computed = 1024 - 30 * BS  # 20 blocks on device, 10 more loaded back from the host tier
        assert e.own_tokens == computed == 544 and e.priced
        assert e.queue_s == pytest.approx(5_000 / 10_000, rel=1e-12)
        assert e.prefill_s == pytest.approx(544 / 10_000, rel=1e-12)
        step_s = 0.008 + 4 * 5e-5 + 40_000 * 4e-8
        assert e.interleave_s == pytest.approx(3 * step_s, rel=1e-12)  # ceil((5000 + 544) / 2048) steps
        assert e.load_back_s == pytest.approx(10 * MIB / 2e10, rel=1e-12)
        raw = 0.5 + 3 * step_s + 0.0544 + 10 * MIB / 2e10
        assert e.raw_s == pytest.approx(raw, rel=1e-12)
        assert e.ttft_s == pytest.approx(0.01 + 2.0 * raw, rel=1e-12)
        assert e.stall_s == pytest.approx(4 * 0.0544, rel=1e-12)
        assert e.delay_s == pytest.approx(0.5 * (0.01 + 2.0 * raw) * 0.0544, rel=1e-12)
        assert e.evict_s == pytest.approx(0.75 / 0.25 * (544 + 10 * BS) / 10_000, rel=1e-12)  # hit 0.75
        assert e.pace_s == pytest.approx(0.008 + 5 * 5e-5 + (40_000 + 1024) * 4e-8, rel=1e-12)
        assert e.choice_s == pytest.approx(e.ttft_s + e.stall_s + e.delay_s + e.evict_s, rel=1e-12)
        assert prices.choice[prices.rows].tolist() == [e.choice_s]


def test_a_pull_is_priced_where_it_beats_computing_and_not_where_it_does_not():
    transfer = {"kv_transfer_enabled": True, "kv_block_bytes": MIB, "prefill_tokens_per_s": 10_000.0}
    holder = load(**transfer, queued_prefill_tokens=50_000)
    idle = load(**transfer, pull_bytes_per_s=1e10, pull_fixed_s=0.001)
    slow = load(**transfer, pull_bytes_per_s=1e6, pull_fixed_s=0.001)
    loads = {"h": holder, "i": idle, "s": slow}
    for prices in both_ways(loads, {"h": 60}, {}, 1024, pulls=PullPriors(True, None, 0.0)):
        assert prices["i"].pulled_blocks == 60 and prices["i"].own_tokens == 1024 - 60 * BS
        assert prices["i"].pull_s == pytest.approx(60 * MIB / 1e10 + 0.001, rel=1e-12)
        assert prices["i"].evict_s == 0.0  # no hits there yet: storing costs nothing later
        assert prices["s"].pulled_blocks == 0 and prices["s"].pull_s == 0.0  # 63 s of pull against 0.1 s computing
        assert prices["h"].pulled_blocks == 0 and prices["h"].own_tokens == 1024 - 60 * BS


def test_a_fleet_that_measured_nothing_is_unpriced_in_prompt_tokens():
    for prices in both_ways({"a": load(num_running=3, arrival_rate=2.0), "b": load()}, {"b": 2}, {}, 100):
        a, b = prices["a"], prices["b"]
        assert not a.priced and a.prefill_s == 100 and a.delay_s == 0.0  # no time scale for the arrivals
        assert a.interleave_s == 3 * 1.0  # no decode fit anywhere: a decode row costs one prompt token
        assert b.prefill_s == 100 - 2 * BS


@pytest.mark.parametrize("rate", NOT_RATES)
def test_a_prefill_rate_that_is_not_a_positive_number_is_not_measured(rate):
    """Hostile: NaN, infinite, 0 or negative is priced at the fleet's slowest, never free and never NaN."""
    odd, known = load(prefill_tokens_per_s=rate), load(prefill_tokens_per_s=5_000.0)
    assert FleetRates.of([odd, known]).prefill_s_per_token == FleetRates.of([known, odd]).prefill_s_per_token == 2e-4
    for prices in both_ways({"odd": odd, "known": known}, {}, {}, 1000):
        assert prices["odd"].priced and prices["odd"].prefill_s == pytest.approx(1000 / 5_000, rel=1e-12)
        assert not np.isnan(prices.choice).any()


@pytest.mark.parametrize("coef", [math.nan, math.inf, -1.0])
def test_a_decode_fit_that_is_not_seconds_is_not_measured(coef):
    odd = load(prefill_tokens_per_s=1000.0, num_running=2, decode_step=DecodeStepLoad(step_s=0.01, s_per_seq=coef))
    alone = both_ways({"odd": odd}, {}, {}, 16)
    for prices in alone:  # no fit anywhere: a decode row costs one prompt token
        assert prices["odd"].interleave_s == pytest.approx(2 / 1000, rel=1e-12)
    fit = load(prefill_tokens_per_s=1000.0, decode_step=DecodeStepLoad(step_s=0.02, s_per_seq=0.001))
    assert FleetRates.of([odd, fit]).decode_step == (0.02, 0.001, 0.0)
    for prices in both_ways({"odd": odd, "fit": fit}, {}, {}, 16):  # the fleet's fit prices it
        assert prices["odd"].interleave_s == pytest.approx(0.02 + 0.001 * 2, rel=1e-12)
        assert prices["odd"].pace_s == pytest.approx(0.02 + 0.001 * 3, rel=1e-12)


def test_huge_loads_are_finite_prices_and_the_idle_replica_wins():
    huge = load(prefill_tokens_per_s=1000.0, queued_prefill_tokens=2**62, num_running=10**6, decode_step=STEP)
    idle = load(prefill_tokens_per_s=1000.0, decode_step=STEP)
    for prices in both_ways({"huge": huge, "idle": idle}, {"huge": 60}, {}, 1024):
        assert prices["huge"].queue_s == pytest.approx(2**62 / 1000, rel=1e-12)
        assert np.isfinite(prices.choice[prices.rows]).all()
        assert prices.choice[prices.row_of("idle")] < prices.choice[prices.row_of("huge")]
    choice = get_policy("cache_aware", block_size=BS).decide(list(range(64)), TierMatches({"huge": 60}),
                                                              candidates({"huge": huge, "idle": idle}), 1024)
    assert choice.replica.id == "idle"


def test_zero_copy_rates_price_a_load_back_as_recomputing_and_plan_no_pull():
    zero = load(prefill_tokens_per_s=1000.0, kv_block_bytes=MIB, h2d_bytes_per_s=0.0, kv_transfer_enabled=True,
                pull_bytes_per_s=0.0)
    holder = load(prefill_tokens_per_s=1000.0, kv_transfer_enabled=True, kv_block_bytes=MIB)
    for prices in both_ways({"zero": zero, "holder": holder}, {"holder": 40}, {"zero": 4}, 1024,
                            pulls=PullPriors(True, None, 0.0)):
        assert prices["zero"].load_back_s == pytest.approx(4 * BS / 1000, rel=1e-12)
        assert prices["zero"].pulled_blocks == 0


def test_a_pull_fixed_cost_that_is_not_a_number_is_the_prior():
    odd = load(prefill_tokens_per_s=100.0, kv_transfer_enabled=True, kv_block_bytes=MIB, pull_bytes_per_s=1e10,
               pull_fixed_s=math.nan)
    holder = load(prefill_tokens_per_s=100.0, kv_transfer_enabled=True, kv_block_bytes=MIB)
    for prices in both_ways({"odd": odd, "holder": holder}, {"holder": 10}, {}, 1024,
                            pulls=PullPriors(True, None, 0.25)):
        assert prices["odd"].pull_s == pytest.approx(10 * MIB / 1e10 + 0.25, rel=1e-12)


def test_an_adapter_not_resident_is_its_size_over_the_load_rate():
    lora = LoRALoad(enabled=True, adapters={"a": 4_000_000}, resident=[], load_bytes_per_s=2e9)
    for prices in both_ways({"x": load(prefill_tokens_per_s=1000.0, lora=lora)}, {}, {}, 64, lora="a"):
        assert prices["x"].adapter_s == pytest.approx(0.002, rel=1e-12)
        assert prices["x"].raw_s == pytest.approx(0.064 + 0.002, rel=1e-12)


VALUES = [0.0, -0.0, 1.0, 2.5, -3.0, 7.0, 1e308, math.nan, math.inf, -math.inf]


def test_the_two_evaluations_choose_and_bound_alike_on_hostile_values():
    """ops.py: the few operations that are not arithmetic give the same float one way and the other."""
    a = np.array(VALUES)
    for b in VALUES:
        np.testing.assert_array_equal(ARRAY.maximum(a, b), [SCALAR.maximum(x, b) for x in VALUES])
        np.testing.assert_array_equal(ARRAY.where(a > b, a, b), [SCALAR.where(x > b, x, b) for x in VALUES])
    np.testing.assert_array_equal(ARRAY.known(a), [SCALAR.known(x) for x in VALUES])
    tokens = np.array([0.0, 1.0, 2047.0, 2048.0, 2049.0, 5544.0, 2.0**52 + 1, 1e18])
    for step_tokens in (2048.0, 7.5, 0.3, 1.0, 0.0, -4.0):
        np.testing.assert_array_equal(ARRAY.steps(tokens, step_tokens),
                                      [SCALAR.steps(float(x), step_tokens) for x in tokens])
