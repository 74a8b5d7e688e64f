"""The simulator's half of ``kvmesh bench emulated_fleet`` gets the requests the live half sends: for each trace
workload, the prompt lengths, output caps and arrival times ``kvmesh bench load`` renders, and for Mooncake the
trace's first records as they were read before the workload could be chosen (the stored results stay reproducible).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvmesh.cluster.measure.loadgen.load import build_sessions
from kvmesh.cluster.measure.loadgen.options import BenchLoadConfig, LoadOptions, WorkloadOptions
from kvmesh.cluster.measure.sim.emulated_check import requests
from kvmesh.cluster.measure.workloads.prompts import PromptMaker
from kvmesh.cluster.measure.workloads.registry import get_workload
from kvmesh.cluster.measure.workloads.traces import default_trace

N, PROMPT, OUT = 60, 1024, 64


@pytest.fixture(autouse=True)
def _traces():
    for name in ("mooncake", "azure_code"):
        path = default_trace(get_workload(name).trace_file)
        if not Path(path).is_file():
            pytest.skip(f"{name} reads {path}, which is not here (../shared/traces)")


@pytest.mark.parametrize("workload", ["mooncake", "azure_code"])
def test_the_simulated_requests_are_what_bench_load_sends(workload):
    from kvmesh.cluster.measure.sim.request import requests_from_mooncake

    sim = requests_from_mooncake(requests(N, PROMPT, OUT, workload), 1.0, 16)
    config = BenchLoadConfig(workload=WorkloadOptions(workload=workload, num_requests=N, max_prompt_tokens=PROMPT,
                                                      max_tokens=OUT, trace_block_tokens=16),
                             load=LoadOptions(mode="open"))
    sessions = build_sessions(config, PromptMaker())
    assert len(sessions) == len(sim) == N
    t0 = sessions[0].arrival_s
    for request, session in zip(sim, sessions, strict=True):
        (turn,) = session.turns
        assert len(turn.user) == request.num_prompt_tokens <= PROMPT
        assert turn.max_tokens == request.max_output_tokens <= OUT
        assert session.arrival_s - t0 == pytest.approx(request.arrival_s)


def test_mooncake_is_the_traces_first_records_cut_to_the_prompt_budget():
    from kvmesh.cluster.measure.sim.request import cut_trace
    from kvmesh.cluster.measure.workloads.traces import default_trace, read_mooncake

    trace = cut_trace(read_mooncake(default_trace(), limit=N), 0, N, max_prompt_blocks=PROMPT // 16)
    assert [(r.hash_ids, r.timestamp_ms) for r in requests(N, PROMPT, OUT)] == \
        [(r.hash_ids, r.timestamp_ms) for r in trace]


@pytest.mark.parametrize("workload", ["chatbot", "azure"])
def test_a_workload_not_replayed_at_its_records_times_is_refused_by_name(workload):
    with pytest.raises(ValueError, match=f"workload '{workload}' is not replayed"):
        requests(N, PROMPT, OUT, workload)


def test_the_validation_table_says_which_margins_a_workload_is_outside():
    from kvmesh.cluster.measure.benchmarks.emulated_fleet import compare, table

    sim = {"cached_share": 0.20, "ttft_s": {"mean": 0.100}, "ttft_by_request": {"a": 0.1, "b": 0.1}}
    live = {"cached_share": 0.195, "ttft_s": {"mean": 0.96}, "ttft_by_request": {"a": 0.8, "b": 1.12},
            "replicas": [{"late_s_p99": 0.008}]}
    result = {"settings": {"workload": "azure_code", "speedup": 3.0, "num_requests": 2},
              "sim": sim, "live": live, "comparison": compare(sim, live, 8.0)}
    row = table([result]).splitlines()[-1]
    assert row.startswith("| azure_code x3, first 2 | 20.00% / 19.50% (-0.50 pt) | "
                          "0.100 s / 0.120 s (+20.0%, outside 5%)")
    assert "| 0 of 2 |" in row and "8 ms (0.83%)" in row  # lateness against the live mean TTFT
