"""Acceptance on a cut of the Mooncake trace: cache-aware routing keeps the single pool's hit rate.

The cut: the last 693 requests (the part of the trace whose prefixes repeat most), prompts
truncated to 128 hash ids, replayed at 2x the trace's rate in front of 16 replicas whose total
capacity is a quarter of the cut's working set, as a 1/8 miniature (64-token blocks, per-token
costs x8: same model time, 8x less hashing). At this load round-robin queues. The full-trace run
is a benchmark (BENCHMARKS.md, "Mooncake trace, 16 replicas").
"""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.config import SimConfig, miniature
from kvmesh.cluster.measure.sim.replica import cut_trace
from kvmesh.cluster.measure.sim.report import format_table
from kvmesh.cluster.measure.sim.run import compare_policies
from kvmesh.cluster.measure.workloads.traces import read_mooncake

POLICIES = ["cache_aware", "round_robin", "least_loaded"]


@pytest.fixture(scope="module")
def report(mooncake_trace):
    records = cut_trace(read_mooncake(mooncake_trace), start=3300, max_prompt_blocks=128)
    config = miniature(SimConfig(num_replicas=16, capacity_fraction=0.25, time_scale=0.5), 8)
    return compare_policies(records, config, POLICIES, show_progress=False)


def test_cut_has_16_replicas_with_a_quarter_of_the_working_set(report):
    assert report["config"]["num_replicas"] == 16
    assert report["total_blocks"] == pytest.approx(report["trace"]["working_set_blocks"] / 4, abs=16)


def test_round_robin_queues_at_this_load(report):
    rr = report["policies"]["round_robin"]
    assert rr["queue_s"]["p99"] > 1.0


def test_cache_aware_reaches_85_percent_of_the_single_pool_hit_rate(report):
    """88.6% with the cost in seconds (the hand-tuned token cost, cache_aware_tokens: >= 90%)."""
    ceiling = report["ceilings"]["single_pool_hit_rate"]
    ca = report["policies"]["cache_aware"]
    assert ca["hit_rate"] >= 0.85 * ceiling
    assert ceiling <= report["ceilings"]["infinite_cache_hit_rate"]
    for baseline in ("round_robin", "least_loaded"):
        assert report["policies"][baseline]["hit_rate"] < 0.5 * ca["hit_rate"]


def test_cache_aware_keeps_load_balanced(report):
    assert report["policies"]["cache_aware"]["load_imbalance"] <= 1.3


def test_cache_aware_ttft_beats_baselines_by_a_wide_margin(report):
    ca = report["policies"]["cache_aware"]["ttft_s"]["p50"]
    for baseline in ("round_robin", "least_loaded"):
        assert ca < 0.5 * report["policies"][baseline]["ttft_s"]["p50"]


def test_report_shows_every_policy_side_by_side(report):
    table = format_table(report)
    lines = table.splitlines()
    assert "single pool" in table and "infinite cache" in table
    start = lines.index(next(x for x in lines if x.startswith("policy"))) + 2
    rows = [line.split()[0] for line in lines[start:start + len(POLICIES)]]
    assert rows == POLICIES
    assert "gap to the single pool" in lines[start + len(POLICIES)]
    for s in report["policies"].values():
        assert {"hit_rate", "ttft_s", "queue_s", "load_imbalance", "events_per_s"} <= set(s)
        assert s["events"] > 0 and s["events_per_s"] > 0
