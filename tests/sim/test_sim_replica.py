"""A simulated replica: real KV cache manager, continuous batching, model time from the cost model."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.config import CostModel, SimConfig, sim_engine
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache

BS = 16
COST = CostModel(step_overhead_s=0.001, prefill_s_per_token=0.001, decode_s_per_step=0.01,
                 decode_s_per_seq=0.0, decode_s_per_context_token=0.0)


def _config(**kw) -> SimConfig:
    engine = sim_engine(block_size=BS, max_num_batched_tokens=kw.pop("budget", 64))
    return SimConfig(engine=engine, cost=kw.pop("cost", COST), vocab_size=256, **kw)


def _req(i: int, hash_ids, n: int, out: int = 1, tokens=BlockTokenCache(BS, 256)) -> SimRequest:
    r = SimRequest(f"r{i}", 0.0, tuple(hash_ids), n, out)
    r.all_token_ids = tokens.prompt(r.hash_ids, n)
    return r


def _run(rep: SimReplica, now: float = 0.0) -> float:
    """Step the replica until idle; returns the time."""
    while (step := rep.schedule(now)) is not None:
        now = step.end_s
        rep.complete_step(now)
    return now


def test_shared_prefix_is_found_in_the_pool_after_the_first_request_finishes():
    rep = SimReplica("0", 32, _config(), b"s" * 32)
    first = _req(0, [1, 2, 3], 48)
    rep.add(first)
    _run(rep)
    assert first.num_cached_tokens == 0 and first.finished_s > 0
    second = _req(1, [1, 2, 9], 48)
    rep.add(second)
    _run(rep, 1.0)
    assert second.num_cached_tokens == 2 * BS  # blocks 1, 2 stayed findable after the first was freed


def test_long_prompt_is_chunked_by_the_token_budget():
    rep = SimReplica("0", 32, _config(budget=32), b"s" * 32)
    req = _req(0, [1, 2, 3, 4, 5], 80)
    rep.add(req)
    end = _run(rep)
    # 80 tokens in chunks of 32, 32, 16 (3 steps), the last one samples the first token
    assert req.first_token_s == pytest.approx(3 * 0.001 + 80 * 0.001)
    assert req.finished_s == end and rep.num_steps == 3


def test_decode_runs_as_one_stretch_until_the_next_completion():
    rep = SimReplica("0", 32, _config(), b"s" * 32)
    req = _req(0, [1], 16, out=11)
    rep.add(req)
    step = rep.schedule(0.0)
    rep.complete_step(step.end_s)
    stretch = rep.schedule(step.end_s)
    assert stretch.num_steps == 10 and not stretch.prefill_chunks
    rep.complete_step(stretch.end_s)
    assert req.num_output_tokens == 11 and req.finished_s == pytest.approx(stretch.end_s)


def test_an_arrival_cuts_a_decode_stretch_after_the_running_step():
    rep = SimReplica("0", 32, _config(), b"s" * 32)
    req = _req(0, [1], 16, out=11)
    rep.add(req)
    rep.complete_step(rep.schedule(0.0).end_s)
    stretch = rep.schedule(1.0)
    version = rep.version
    new_end = rep.interrupt(1.0 + 2.5 * stretch.step_s)  # during the third step
    assert new_end == pytest.approx(1.0 + 3 * stretch.step_s) and rep.version == version + 1
    rep.complete_step(new_end)
    assert req.num_output_tokens == 1 + 3


def test_waiting_request_is_admitted_when_blocks_free_up():
    rep = SimReplica("0", 4, _config(), b"s" * 32)
    a, b = _req(0, [1, 2, 3], 40, out=8), _req(1, [7, 8, 9], 40, out=8)  # 3 blocks each, pool of 4
    rep.add(a)
    rep.add(b)
    _run(rep)
    assert b.admitted_s >= a.finished_s > 0


def test_request_larger_than_a_replica_is_refused_clearly():
    rep = SimReplica("0", 2, _config(), b"s" * 32)
    with pytest.raises(ValueError, match="needs 3 blocks.*holds 2"):
        rep.add(_req(0, [1, 2, 3], 40))


def test_prefix_evicted_from_the_pool_comes_back_from_the_host_tier_for_its_load_time():
    cost = CostModel(step_overhead_s=0.001, prefill_s_per_token=0.001, decode_s_per_step=0.01,
                     decode_s_per_seq=0.0, decode_s_per_context_token=0.0, load_s_per_token=0.0001)
    rep = SimReplica("0", 4, _config(offload_blocks_per_replica=16, cost=cost), b"s" * 32)
    first = _req(0, [1, 2, 3], 48)
    rep.add(first)
    _run(rep)
    rep.add(_req(1, [7, 8, 9], 48))  # takes every device block: [1, 2, 3] leave the device
    _run(rep, 1.0)
    again = _req(2, [1, 2, 3], 48)
    rep.add(again)
    step = rep.schedule(2.0)
    assert again.num_cached_tokens == 2 * BS and again.num_host_cached_tokens == 2 * BS
    assert rep.loaded_tokens == 2 * BS
    assert step.step_s == pytest.approx(0.001 + 0.001 * BS + 0.0001 * 2 * BS)  # 1 block computed, 2 loaded
