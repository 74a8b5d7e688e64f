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

    sim = {"cached_share": 0.20, "ttft_s": {"mean": 0.100}, "ttft_by_request": {"a": 0.1, "b": 0.1},
           "cached_by_request": {"a": 32, "b": 0}}
    live = {"cached_share": 0.195, "ttft_s": {"mean": 0.96}, "ttft_by_request": {"a": 0.8, "b": 1.12},
            "cached_by_request": {"a": 32, "b": 16}, "fleet_and_router_cpu_s": 30.0, "duration_s": 120.0,
            "replicas": [{"late_s_p99": 0.008, "cpu_s_per_step": 0.0004},
                         {"late_s_p99": 0.002, "cpu_s_per_step": 0.0005}]}
    replayed = {"cached_share": 0.195, "ttft_s": {"mean": 0.114}}  # the simulator on the live placements
    result = {"settings": {"workload": "azure_code", "speedup": 3.0, "num_requests": 2},
              "sim": sim, "live": live, "comparison": compare(sim, live, 8.0, replayed)}
    row = table([result]).splitlines()[-1]
    assert row.startswith("| azure_code x3, first 2 | 20.00% / 19.50% (-0.50 pt) | "
                          "0.100 s / 0.120 s (+20.0%, outside 5%)")
    assert "| 0 of 2 | 1 of 2 |" in row  # none off by 100 ms; one placed apart (its cached tokens differ)
    assert "| 19.50%, 0.114 s (+5.3%) |" in row  # the fleet against the simulator on its own placements
    assert "8 ms (0.83%)" in row  # lateness against the live mean TTFT
    assert "30 s in 120 s (0.25 cores); 0.40-0.50 ms" in row  # what the emulation cost


def test_the_simulator_given_its_own_placements_runs_as_it_did_and_a_live_replica_is_one_by_rank():
    """The replay of placements changes nothing when they are the simulator's own (renamed as a live run's replicas
    would be), so what it leaves against a live run is the replicas' timing."""
    from kvmesh.cluster.measure.sim.emulated_check import simulate

    records = requests(N, PROMPT, OUT, "azure_code")
    own = simulate(records, 4, "cache_aware_tokens", 0, 1.0, 3.0)
    live_names = {rid: f"http://127.0.0.1:{9000 + int(r)}" for rid, r in own["replica_by_request"].items()}
    replayed = simulate(records, 4, "cache_aware_tokens", 0, 1.0, 3.0, live_names)
    assert replayed["ttft_by_request"] == own["ttft_by_request"]
    assert replayed["cached_by_request"] == own["cached_by_request"]
    assert len(set(own["replica_by_request"].values())) > 1


def test_placements_name_replicas_by_first_use_and_refuse_a_larger_fleet():
    from kvmesh.cluster.measure.sim.placement_replay import placements

    assert placements(["a", "b", "c"], {"a": "x", "b": "y", "c": "x"}, ["0", "1"]) == ["0", "1", "0"]
    with pytest.raises(ValueError, match="used 3 replicas, the simulator has 2"):
        placements(["a", "b", "c"], {"a": "x", "b": "y", "c": "z"}, ["0", "1"])
