"""The simulator with the router's admission (router/admission/ driven in simulated time): under overload it
sheds with a reason, nothing waits past its deadline, the high-priority class keeps its TTFT, and goodput beats
admission off; off, every request is served."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kvmesh.cluster.measure.sim.config import SimConfig, miniature, sim_engine
from kvmesh.cluster.measure.sim.goodput import goodput_summary, label_requests
from kvmesh.cluster.measure.sim.loop import run_policy
from kvmesh.cluster.measure.sim.overload import arrival_rps, capacity_rps, run_overload
from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.sim.run import blocks_per_replica
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.registry import get_workload
from kvmesh.cluster.measure.workloads.settings import WorkloadSettings
from kvmesh.cluster.measure.workloads.tenants import assign_tenants, parse_tenant_mix
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.decisions import SHED_REASONS

pytestmark = pytest.mark.slow  # each simulates a trace under overload


@pytest.fixture(scope="module")
def workload():
    records = get_workload("chatbot").make(WorkloadSettings(num_requests=1000, prompt_tokens=2048, output_tokens=64))
    config = miniature(SimConfig(num_replicas=2, engine=replace(sim_engine(), max_num_seqs=16), tenants="overload"), 8)
    return records, config


def run(records, config, time_scale: float, admission: bool):
    config = replace(config, time_scale=time_scale, admission=admission, engine=replace(
        config.engine, scheduling_policy="priority" if admission else "fcfs"))
    requests = requests_from_mooncake(records, time_scale, config.engine.block_size)
    label_requests(requests, assign_tenants(records, parse_tenant_mix(config.tenants), config.seed))
    tokens = BlockTokenCache(config.engine.block_size, config.vocab_size, config.seed)
    return run_policy("cache_aware", requests, config, blocks_per_replica(config, records), tokens).requests


@pytest.mark.parametrize("pricing", ["queue", "slots"])
def test_overloaded_admission_sheds_early_and_keeps_deadlines(workload, pricing):
    records, config = workload
    config = replace(config, admission_pricing=pricing)
    scale = arrival_rps(records) / (4 * capacity_rps(records, config, "cache_aware"))  # 4x the capacity
    on, off = run(records, config, scale, True), run(records, config, scale, False)
    assert not any(r.shed_reason for r in off) and all(r.finished_s > 0 for r in off)
    shed = [r for r in on if r.shed_reason is not None]
    assert 0 < len(shed) < len(on) and {r.shed_reason for r in shed} <= set(SHED_REASONS)
    for r in on:
        if r.shed_reason is None:
            assert r.finished_s > 0 and r.routed_s >= r.arrival_s
            assert r.routed_s - r.arrival_s <= r.ttft_target_s + 1e-9  # nothing went on past its deadline
        else:
            assert r.finished_s < 0 and r.first_token_s < 0  # never served
    g_on, g_off = goodput_summary(on), goodput_summary(off)
    assert g_on["goodput_rps"] > 2 * g_off["goodput_rps"]  # the acceptance: at 4x, >= 2x
    premium_on, premium_off = g_on["per_priority"]["-1"], g_off["per_priority"]["-1"]
    assert premium_on["ttft_s"]["p50"] < premium_off["ttft_s"]["p50"] / 4


def test_run_overload_reports_each_level_off_and_on(workload):
    records, config = workload
    result = run_overload(records[:120], config, levels=(2.0,))
    (row,) = result["levels"]
    assert row["load"] == 2.0 and row["offered_rps"] == pytest.approx(2 * result["capacity_rps"])
    assert row["off"]["goodput"]["shed"] == 0 and row["on"]["goodput"]["requests"] == 120
    assert set(result["runs"]) == {"cache_aware/2x/off", "cache_aware/2x/on"}


def test_a_tenant_over_its_token_rate_is_shed_and_the_light_ones_are_not(workload):
    records, config = workload
    config = replace(config, router=replace(config.router, admission=AdmissionConfig(tokens_per_s=2000.0)))
    scale = arrival_rps(records) / capacity_rps(records, config, "cache_aware")  # 1x: no deadline pressure
    reasons: dict[str, set] = {}
    for r in run(records, config, scale, True):
        reasons.setdefault(r.tenant, set()).add(r.shed_reason)
    assert "tenant_over_limit" in reasons["flood"]  # ~5,000 tokens/s against 2,000
    assert "tenant_over_limit" not in reasons["light-a"] | reasons["light-b"]  # ~600 tokens/s each
