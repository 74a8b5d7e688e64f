"""The whole Mooncake trace at 2x its rate, as a 1/8 miniature (same model
time, 8x less hashing; BENCHMARKS.md, "Mooncake trace, 16 replicas", has the full-size run): cache_aware keeps >= 92% of
the
single pool's hit rate with the load balanced, and has the lowest TTFT p50 and p99 of the policies side by side.

cache_aware's cost is in seconds, without hand weights (router/routing/cost/): 92.4% of the single pool
(the token cost it replaced, ``cache_aware_tokens``, with its weights tuned on this trace: 97.2%), max/mean load
1.10 (1.04), TTFT p50 0.080 s (0.078 s), p99 4.81 s (4.73 s)."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.config import SimConfig, miniature
from kvmesh.cluster.measure.sim.run import compare_policies
from kvmesh.cluster.measure.workloads.traces import read_mooncake

POLICIES = ["cache_aware", "least_loaded", "prefix_hash"]


@pytest.fixture(scope="module")
def report(mooncake_trace):
    config = miniature(SimConfig(num_replicas=16, capacity_fraction=0.25, time_scale=0.5), 8)
    return compare_policies(read_mooncake(mooncake_trace), config, POLICIES, show_progress=False)


def test_cache_aware_keeps_96_percent_of_the_single_pool_with_balanced_load(report):
    ca = report["policies"]["cache_aware"]
    assert ca["hit_rate_vs_single_pool"] >= 0.92
    assert ca["load_imbalance"] <= 1.15


def test_cache_aware_has_the_lowest_ttft_p50_and_p99(report):
    ttft = {name: s["ttft_s"] for name, s in report["policies"].items()}
    for q in ("p50", "p99"):
        assert min(ttft, key=lambda name: ttft[name][q]) == "cache_aware"


def test_what_is_left_of_the_gap_is_mostly_evictions_not_diversions(report):
    gap = report["policies"]["cache_aware"]["gap_to_single_pool"]
    assert gap["diverted_points"] < 2.0 < gap["evicted_everywhere_points"]
    assert report["policies"]["cache_aware"]["receipts"]["captured_ratio"] > 0.95
