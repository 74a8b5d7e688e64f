"""Tenants, priorities and targets over a workload; goodput; a simulated replica scheduling by priority."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kvmesh.cluster.measure.sim.config import CostModel, SimConfig, sim_engine
from kvmesh.cluster.measure.sim.goodput import goodput_summary, is_good, label_requests, tpot_s
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.generated import SessionRecord
from kvmesh.cluster.measure.workloads.tenants import TenantClass, assign_tenants, parse_tenant_mix


def served(rid: str, arrival: float, first: float, finished: float, outputs: int, **kw) -> SimRequest:
    r = SimRequest(rid, arrival, (1,), 16, outputs, **kw)
    r.first_token_s, r.finished_s, r.num_output_tokens = first, finished, outputs
    return r


def test_a_request_is_good_when_it_meets_both_targets():
    ok = served("ok", 0.0, 0.5, 1.5, 11, ttft_target_s=1.0, itl_target_s=0.1)  # TPOT 1.0 / 10 = 0.1
    assert tpot_s(ok) == pytest.approx(0.1) and is_good(ok)
    assert not is_good(served("late", 0.0, 1.2, 1.5, 11, ttft_target_s=1.0, itl_target_s=0.1))
    assert not is_good(served("slow", 0.0, 0.5, 2.0, 11, ttft_target_s=1.0, itl_target_s=0.1))
    assert is_good(served("any", 0.0, 9.0, 99.0, 2))  # no targets: served is good
    assert is_good(served("one", 0.0, 0.5, 0.5, 1, itl_target_s=0.001))  # one token: no inter-token time
    shed = SimRequest("shed", 0.0, (1,), 16, 4, ttft_target_s=1.0, shed_reason="queue_full")
    assert not is_good(shed)


def test_goodput_counts_good_requests_per_second_of_arrivals_per_tenant_and_priority():
    reqs = [served("a", 0.0, 0.2, 1.0, 5, tenant="flood", ttft_target_s=1.0),
            served("b", 5.0, 7.0, 8.0, 5, tenant="flood", ttft_target_s=1.0),   # TTFT 2 s: missed
            served("c", 10.0, 10.1, 11.0, 5, tenant="premium", priority=-1, ttft_target_s=0.5),
            SimRequest("d", 10.0, (1,), 16, 5, tenant="flood", shed_reason="deadline")]
    g = goodput_summary(reqs)
    assert g["window_s"] == 10.0 and g["good"] == 2 and g["goodput_rps"] == pytest.approx(0.2)
    assert g["shed"] == 1 and g["shed_reasons"] == {"deadline": 1} and g["served"] == 3
    assert g["per_tenant"]["flood"]["good"] == 1 and g["per_tenant"]["flood"]["shed_rate"] == pytest.approx(1 / 3)
    assert g["per_priority"]["-1"]["good_rate"] == 1.0 and g["per_priority"]["0"]["requests"] == 3
    assert g["ttft_s"]["p50"] == pytest.approx(0.2)  # of the served only


def test_tenant_mix_parses_presets_and_specs_and_refuses_bad_ones():
    mix = parse_tenant_mix("overload")
    assert [t.name for t in mix] == ["flood", "light-a", "light-b", "premium"]
    assert mix[3].priority == -1 and mix[3].ttft_s == 0.5
    assert parse_tenant_mix("a:3,b:1:-2:0.5") == [TenantClass("a", 3.0), TenantClass("b", 1.0, -2, 0.5)]
    assert parse_tenant_mix("") == []
    for bad in ("a", "a:x", "a:1:0.5", "a:1,a:2", "a:-1", "a:1:0:0"):
        with pytest.raises(ValueError):
            parse_tenant_mix(bad)
    with pytest.raises(ValueError, match="tenant"):
        SimConfig(tenants="a:1:x")


def test_a_session_keeps_its_tenant_and_shares_are_followed():
    records = [SessionRecord(float(i), 16, 1, (i,), f"s{i // 3}") for i in range(3000)]
    mix = [TenantClass("big", 3.0), TenantClass("small", 1.0)]
    classes = assign_tenants(records, mix, seed=1)
    for i in range(0, 3000, 3):
        assert classes[i] is classes[i + 1] is classes[i + 2]
    share = sum(c.name == "big" for c in classes) / len(classes)
    assert 0.70 < share < 0.80
    assert classes == assign_tenants(records, mix, seed=1)
    reqs = [SimRequest(f"r{i}", 0.0, (i,), 16, 1) for i in range(3000)]
    label_requests(reqs, classes)
    assert reqs[0].tenant == classes[0].name


COST = CostModel(step_overhead_s=0.001, prefill_s_per_token=0.001, decode_s_per_step=0.01,
                 decode_s_per_seq=0.0, decode_s_per_context_token=0.0)


@pytest.mark.parametrize("policy, order", [("fcfs", ["low", "mid", "high"]), ("priority", ["high", "mid", "low"])])
def test_a_simulated_replica_admits_by_the_engines_scheduling_policy(policy, order):
    engine = replace(sim_engine(block_size=16, max_num_batched_tokens=64, max_num_seqs=1), scheduling_policy=policy)
    rep = SimReplica("0", 32, SimConfig(engine=engine, cost=COST), b"s" * 32)
    tokens = BlockTokenCache(16, 256)
    for i, (rid, priority) in enumerate([("low", 2), ("mid", 0), ("high", -1)]):
        r = SimRequest(rid, 0.001 * i, (10 * i,), 16, 2, priority=priority)
        r.all_token_ids = tokens.prompt(r.hash_ids, 16)
        rep.add(r)
    now, admitted = 0.0, []
    while (step := rep.schedule(now)) is not None:
        admitted += [r.request_id for r, _ in step.prefill_chunks if r.num_computed_tokens == 0]
        now = step.end_s
        rep.complete_step(now)
    assert admitted == order
