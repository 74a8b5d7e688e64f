"""LoRA adapters and several base models in the simulator (sim/lora.py, workloads/adapters.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from kvmesh.cluster.measure.sim.config import CostModel, SimConfig, sim_engine
from kvmesh.cluster.measure.sim.lora import LoRASlots
from kvmesh.cluster.measure.sim.lora_config import SimLoRAConfig
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.measure.sim.run import compare_policies
from kvmesh.cluster.measure.workloads.adapters import (
    AdapterShape,
    adapter_name,
    adapter_requests,
    zipf_weights,
)
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.registry import get_workload
from kvmesh.cluster.measure.workloads.settings import WorkloadSettings, WorkloadShape

BS = 16
COST = CostModel(step_overhead_s=0.001, prefill_s_per_token=0.001, decode_s_per_step=0.01,
                 decode_s_per_seq=0.0, decode_s_per_context_token=0.0)
LORA = SimLoRAConfig(max_loras=1, lora_bytes=1000, lora_load_bytes_per_s=10_000)  # a load: 0.1 s


def _req(i: int, lora: str | None, out: int = 3, tokens=BlockTokenCache(BS, 256)) -> SimRequest:
    r = SimRequest(f"r{i}", 0.0, (1000 + i,), BS, out, lora_name=lora)
    r.all_token_ids = tokens.prompt(r.hash_ids, BS)
    return r


def _replica(lora: SimLoRAConfig = LORA) -> SimReplica:
    config = SimConfig(engine=sim_engine(block_size=BS, max_num_batched_tokens=256), cost=COST, lora=lora)
    return SimReplica("0", 64, config, b"s" * 32)


def _run(rep: SimReplica, now: float = 0.0) -> float:
    while (step := rep.schedule(now)) is not None:
        now = step.end_s
        rep.complete_step(now)
    return now


def test_a_step_batches_at_most_max_loras_adapters_and_later_requests_of_a_running_adapter_go_first():
    rep = _replica()
    a1, b, a2, base = _req(0, "a"), _req(1, "b"), _req(2, "a"), _req(3, None)
    for r in (a1, b, a2, base):
        rep.add(r)
    step = rep.schedule(0.0)
    # a's first request takes the one slot; b is passed over; a's second and the base request join the batch
    assert [r.request_id for r, _ in step.prefill_chunks] == ["r0", "r2", "r3"]
    assert list(rep.waiting) == [b]
    assert step.step_s == pytest.approx(0.001 + 3 * BS * 0.001 + 0.1)  # the step waited for a's load
    _run(rep)
    assert b.admitted_s >= max(a1.finished_s, a2.finished_s)  # b waited until a's requests left the batch
    assert rep.lora.num_loads == 2 and rep.lora.load_s == pytest.approx(0.2)
    assert rep.lora.waited == {"r1"}


def test_slots_are_reused_least_recently_used_first_and_a_resident_adapter_loads_no_more():
    slots = LoRASlots(replace(LORA, max_loras=2))
    for name in ("a", "b", "a", "c"):  # c evicts b (a was used after b)
        slots.admit(_req(0, name), [])
    assert list(slots.resident) == ["a", "c"] and slots.num_loads == 3
    running = [_req(1, "a"), _req(2, "c")]
    assert not slots.fits(_req(3, "b"), running) and slots.fits(_req(4, "c"), running)
    section = slots.section(running)
    assert section.resident == ["a", "c"] and section.active == ["a", "c"]
    assert section.adapters == {"a": 1000, "b": 1000, "c": 1000} and section.load_bytes_per_s == 10_000


def test_the_lora_workload_spreads_requests_over_adapters_by_zipf_with_prefixes_of_their_own():
    shape = AdapterShape(num_adapters=8, adapter_zipf=1.1, adapter_prefixes=2, num_models=2)
    recs = adapter_requests(4000, 2048, shape, seed=1)
    counts = Counter(r.lora_name for r in recs)
    weights = zipf_weights(8, 1.1)
    assert counts[adapter_name(0)] / 4000 == pytest.approx(weights[0], abs=0.03)
    assert counts[adapter_name(0)] > counts[adapter_name(3)] > counts[adapter_name(7)]
    prefixes: dict[str, set] = {}
    for r in recs:
        prefixes.setdefault(r.lora_name, set()).add(r.hash_ids[:r.system_blocks])
        assert r.model == f"model-{int(r.lora_name.split('-')[1]) % 2}"
    assert all(len(p) == 2 for p in prefixes.values())
    assert len(set().union(*prefixes.values())) == 16  # no adapter shares another's prefixes
    assert get_workload("lora").make(WorkloadSettings(num_requests=10, shape=WorkloadShape(
        adapters=AdapterShape(num_adapters=3)))) and recs == adapter_requests(4000, 2048, shape, seed=1)


def _compare(aware: bool, records, **changes):
    config = SimConfig(num_replicas=4, engine=sim_engine(block_size=32, max_num_batched_tokens=2048),
                       blocks_per_replica=48, lora=SimLoRAConfig(max_loras=2, adapter_aware=aware), **changes)
    return compare_policies(records, config, ["cache_aware"], show_progress=False, with_ceilings=False)


def test_adapter_aware_routing_finds_adapter_prefixes_that_adapter_blind_routing_cannot():
    shape = AdapterShape(num_adapters=8, adapter_prefixes=1)
    records = adapter_requests(300, 8 * 512, shape, rate=4.0, output_tokens=4, seed=2)
    aware = _compare(True, records)["policies"]["cache_aware"]
    blind = _compare(False, records)["policies"]["cache_aware"]
    assert aware["hit_rate"] > blind["hit_rate"] + 0.1
    assert aware["lora"]["adapter_loads"] < blind["lora"]["adapter_loads"]
    assert aware["lora"]["adapter_requests"] == 300


def test_requests_of_several_base_models_go_to_their_models_replicas_only():
    from kvmesh.cluster.measure.sim.loop import run_policy
    from kvmesh.cluster.measure.sim.lora import with_adapters
    from kvmesh.cluster.measure.sim.replica import requests_from_mooncake

    records = adapter_requests(120, 4 * 512, AdapterShape(num_adapters=6, num_models=2, base_share=0.3),
                               rate=4.0, output_tokens=2, seed=3)
    config = SimConfig(num_replicas=4, engine=sim_engine(block_size=32, max_num_batched_tokens=2048))
    reqs = with_adapters(requests_from_mooncake(records, 1.0, 32), records)
    run = run_policy("cache_aware", reqs, config, 48, BlockTokenCache(32, 256))
    pools = run.router.pools.model_of
    assert sorted(Counter(pools.values()).values()) == [2, 2]
    assert any(r.lora_name is None for r in reqs)
    for r in reqs:
        assert pools[r.replica_id] == r.model
