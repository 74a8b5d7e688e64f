"""Regression guard: on cuts of the shared traces the default policy's hit rate is at least every other policy's
(within 0.2 points) and its TTFT p50 and p99 at most every other's (within 1%): the verdict of the policy matrix
benchmark (``kvmesh bench policy_matrix``, cluster/measure/benchmarks/policy_matrix.py), on runs of seconds.

Each cut: 16 replicas holding a quarter of the cut's working set, a 1/8 miniature (64-token blocks, per-token costs
x8), prompts truncated to 128 hash ids, at twice the trace's rate. The whole traces at 1x, 2x and 3x, with pulls and a
host tier, are the benchmark's cells (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from kvmesh.cluster.measure.benchmarks.policy_matrix import HIT_SLACK, TTFT_SLACK, dominance
from kvmesh.cluster.measure.sim.config import SimConfig, miniature
from kvmesh.cluster.measure.sim.request import cut_trace
from kvmesh.cluster.measure.sim.rivals import COMPARED, RIVALS
from kvmesh.cluster.measure.sim.run import compare_policies
from kvmesh.cluster.measure.workloads.registry import get_workload
from kvmesh.cluster.measure.workloads.settings import WorkloadSettings
from kvmesh.cluster.measure.workloads.traces import default_trace
from kvmesh.router.routing.policies import DEFAULT_POLICY

pytestmark = pytest.mark.slow  # simulates the policies on whole workloads

CUTS = {"mooncake": ("mooncake_synthetic_trace.jsonl", 2000, None),
        "azure_conv": ("AzureLLMInferenceTrace_conv.csv", 0, 3000)}
"""Workload -> (its shared trace, first record, records; None: to the end)."""


@functools.cache
def _figures(workload: str) -> dict[str, dict]:
    trace, start, count = CUTS[workload]
    path = default_trace(trace)
    if not Path(path).exists():
        pytest.skip(f"trace not found at {path} (needs ../shared beside the checkout)")
    records = get_workload(workload).make(WorkloadSettings(trace=path))
    records = cut_trace(records, start=start, count=count, max_prompt_blocks=128)
    config = miniature(SimConfig(num_replicas=16, capacity_fraction=0.25, time_scale=0.5), 8)
    report = compare_policies(records, config, list(COMPARED), show_progress=False, with_ceilings=False)
    return {name: {"hit_rate": p["hit_rate"], "ttft_p50": p["ttft_s"]["p50"], "ttft_p99": p["ttft_s"]["p99"]}
            for name, p in report["policies"].items()}


def _rivals(workload: str, peers: bool) -> dict[str, dict]:
    """The default's figures beside kvmesh's other policies' (``peers``: beside the peers' formulas instead)."""
    figures = _figures(workload)
    return {name: f for name, f in figures.items() if name == DEFAULT_POLICY or (name in RIVALS) == peers}


@pytest.mark.parametrize("workload", CUTS)
def test_the_default_policy_dominates_kvmeshs_other_policies_on_a_cut_of_the_trace(workload):
    figures = _figures(workload)
    assert set(figures) == set(COMPARED)
    assert dominance(_rivals(workload, peers=False)) == {}, f"{DEFAULT_POLICY} on {workload}: {figures}"


@pytest.mark.parametrize("workload", CUTS)
def test_the_default_policy_dominates_the_peers_formulas_on_a_cut_of_the_trace(workload):
    assert dominance(_rivals(workload, peers=True)) == {}, f"{DEFAULT_POLICY} on {workload}: {_figures(workload)}"


def test_the_verdict_names_the_policy_and_metric_where_the_default_falls_short():
    """The hostile case: a policy that is better on each metric by more than the slack is named, the worst first."""
    mine = {"hit_rate": 0.40, "ttft_p50": 1.0, "ttft_p99": 5.0}
    figures = {DEFAULT_POLICY: mine,
               "a": {"hit_rate": 0.40 + 2 * HIT_SLACK, "ttft_p50": 1.0, "ttft_p99": 5.0},
               "b": {"hit_rate": 0.40 + 3 * HIT_SLACK, "ttft_p50": 1.0 / (1 + 2 * TTFT_SLACK), "ttft_p99": 5.0},
               "within": {"hit_rate": 0.40 + HIT_SLACK / 2, "ttft_p50": 1.0 / (1 + TTFT_SLACK / 2), "ttft_p99": 4.99}}
    assert dominance(figures) == {"hit_rate": ("b", figures["b"]["hit_rate"], 0.40),
                                  "ttft_p50": ("b", figures["b"]["ttft_p50"], 1.0)}
    assert dominance({DEFAULT_POLICY: mine, "same": dict(mine)}) == {}
