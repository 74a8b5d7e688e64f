"""Generated workloads: tool-agent forks, Azure arrivals with shared prefixes, bursts."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from kvmesh.cluster.cli import main
from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.sim.report import infinite_hit_rate
from kvmesh.cluster.measure.workloads.generated import AzurePrefixes, ToolAgentTrace, bursty
from kvmesh.cluster.measure.workloads.traces import AzureRecord, MooncakeRecord


def test_tool_agent_branches_fork_from_one_trajectory_at_each_step():
    shape = ToolAgentTrace(num_requests=96, num_tenants=2, tools_blocks=6, task_blocks=2, steps=3, fanout=4,
                           step_s=10.0)
    recs = shape.records()
    assert len(recs) == 96 and [r.timestamp_ms for r in recs] == sorted(r.timestamp_ms for r in recs)
    assert len({r.hash_ids[:6] for r in recs}) == 2  # two tenants' tool definitions
    by_agent = defaultdict(list)
    for r in recs:
        by_agent[r.session_id].append(r)
    for reqs in by_agent.values():
        steps = defaultdict(list)
        for r in reqs:
            steps[len(r.hash_ids)].append(r.hash_ids)
        for branches in steps.values():
            if len(branches) == shape.fanout:  # siblings share everything but their own block
                assert len({b[:-1] for b in branches}) == 1 and len({b[-1] for b in branches}) == shape.fanout
    assert infinite_hit_rate(requests_from_mooncake(recs), 512) > 0.6


def test_azure_prefixes_keep_arrivals_and_lengths_and_share_tenant_prompts():
    azure = [AzureRecord(0.5 * i, 600 + 500 * (i % 5), 20 + i % 7) for i in range(400)]
    recs = AzurePrefixes(num_tenants=4, system_blocks=2, followup_share=0.5, seed=1).records(azure)
    assert [(r.arrival_s, r.input_length, r.output_length) for r in recs] == \
        [(a.arrival_s, a.context_tokens, a.generated_tokens) for a in azure]
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in recs)
    assert len({r.hash_ids[:2] for r in recs if len(r.hash_ids) > 2}) <= 4
    by_session = defaultdict(list)
    for r in recs:
        by_session[r.session_id].append(r.hash_ids)
    followups = [c for c in by_session.values() if len(c) > 1]
    assert followups and all(b[: len(a)] == a for c in followups for a, b in zip(c, c[1:], strict=False))
    assert infinite_hit_rate(requests_from_mooncake(recs), 512) > 0.2


def test_bursty_keeps_order_and_mean_rate_and_packs_bursts():
    recs = [MooncakeRecord(1000.0 * 0.1 * i, 512, 1, (i,)) for i in range(6000)]  # 10/s for 600 s
    warped = bursty(recs, burst_factor=4.0, burst_duty=0.2, burst_period_s=60.0)
    times = [r.arrival_s for r in warped]
    assert times == sorted(times) and times[-1] == pytest.approx(recs[-1].arrival_s, abs=1.0)
    in_burst = sum(1 for t in times if t % 60.0 < 12.0)
    assert in_burst == pytest.approx(0.8 * len(times), rel=0.02)  # 4x the rate for a fifth of the time
    with pytest.raises(ValueError, match="burst_factor \\* burst_duty < 1"):
        bursty(recs, burst_factor=6.0, burst_duty=0.2)


def test_cli_runs_a_generated_workload_with_router_and_session_variants(tmp_path, capsys):
    out = tmp_path / "agent.json"
    rc = main(["sim", "--workload", "tool_agent", "--num-requests", "120", "--num-replicas", "4",
               "--blocks-per-replica", "64", "--miniature", "16",
               "--routers", "1,2", "--sessions", "both", "--policies", "cache_aware", "--no-plot",
               "--no-progress", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert list(report["policies"]) == ["cache_aware/1r/no-sessions", "cache_aware/1r/sessions",
                                        "cache_aware/2r/no-sessions", "cache_aware/2r/sessions"]
    assert report["policies"]["cache_aware/2r/sessions"]["num_routers"] == 2
    assert "gap to the single pool" in capsys.readouterr().out


def test_cli_rejects_bad_router_counts(capsys):
    with pytest.raises(SystemExit):
        main(["sim", "--routers", "0"])
    assert "expected integers >= 1" in capsys.readouterr().err
