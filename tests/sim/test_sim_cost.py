"""``kvmesh sim`` runs the router's cost in seconds (router/routing/cost/) on what its simulated replicas measure of
themselves and report, as real replicas do (cluster/measure/sim/measured.py)."""

from __future__ import annotations

import random

import pytest
from kvmesh.cluster.measure.sim.config import SimConfig, sim_engine
from kvmesh.cluster.measure.sim.loop import run_policy
from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord
from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.router.routing.cost import price_all
from kvmesh.router.routing.tier_matches import TierMatches

BS = 64


def _records(n: int = 120, seed: int = 0) -> list[MooncakeRecord]:
    """Requests over 4 shared prefixes with decodes long enough that steps decode batches of several sizes."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(20.0)
        prefix = rng.randrange(4)
        ids = (*range(100 * prefix, 100 * prefix + rng.randrange(2, 8)), 10_000 + i)
        out.append(MooncakeRecord(t * 1000, len(ids) * BS, rng.randrange(8, 64), ids))
    return out


def _run(config: SimConfig, policy: str = "cache_aware"):
    tokens = BlockTokenCache(BS, config.vocab_size, config.seed)
    return run_policy(policy, requests_from_mooncake(_records(), block_size=BS), config, 200, tokens)


def test_simulated_replicas_report_what_they_measured_and_the_router_prices_with_the_same_code():
    config = SimConfig(num_replicas=3, engine=sim_engine(block_size=BS, max_num_batched_tokens=512),
                       blocks_per_replica=200, load_poll_s=0.05)
    run = _run(config)
    cost = config.cost
    rep = max(run.replicas, key=lambda r: r.measures.decode_step_time.num_steps)
    report = rep.load_report()
    assert isinstance(report, LoadReport)  # the replica's /load, decoded as the router decodes a real one
    step = report.decode_step  # its fit over its own decode steps recovers the sim's step-time model
    assert step.num_steps > 10 and step.step_s == pytest.approx(cost.step_overhead_s + cost.decode_s_per_step)
    assert step.s_per_seq == pytest.approx(cost.decode_s_per_seq, rel=1e-3)
    assert step.s_per_context_token == pytest.approx(cost.decode_s_per_context_token, rel=1e-3)
    # its prefill rate over its own steps with prompt tokens: their fixed costs and decode rows only lower it
    assert 0 < report.prefill_tokens_per_s < 1 / cost.prefill_s_per_token
    router = run.router.router
    loads = router.loads.loads
    assert all(load.decode_step is not None for load in loads.values())  # polled: the measured reports
    # its null block too
    assert report.num_kv_blocks == 201 and {load.num_kv_blocks for load in loads.values()} == {201}
    # every request got a price from the router's cost code, and the router learned from the TTFTs it saw
    assert all(r.receipt.predicted_ttft_s is not None and r.receipt.predicted_ttft_s > 0 for r in run.requests)
    assert any(load.ttft_sums for load in loads.values())
    keys = router.hasher.keys(run.requests[0].all_token_ids or [3] * (4 * BS))
    priced = price_all(loads, router.index.match(keys), {}, 4 * BS, BS, 512)
    assert set(priced) == set(loads) and all(e.priced for e in priced.values())
    choice = router.policy.decide(keys, TierMatches(router.index.match(keys)), router.candidates(set()), 4 * BS)
    assert choice.estimate.choice_s == min(e.choice_s for e in choice.prices.values())


def test_the_router_knows_each_simulated_cache_size_before_any_poll():
    """A simulated replica's cache size reaches the router as a live one's does on /load (its null block included),
    polled or not: the router sizes its eviction ghosts by it (router/routing/eviction_ghosts.py)."""
    config = SimConfig(num_replicas=2, engine=sim_engine(block_size=BS), blocks_per_replica=200)
    assert config.load_poll_s == 0  # no poll: the router's first view
    run = _run(config, "cache_aware_tokens")
    assert {load.num_kv_blocks for load in run.router.router.loads.loads.values()} == {201}
