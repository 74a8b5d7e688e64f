"""Replicas joining and leaving in the simulator: the live autoscaler's policy on the Mooncake
trace at a rate that varies, against a fixed fleet sized for the peak."""

from __future__ import annotations

import pytest
from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.replica import SimRequest, cut_trace, requests_from_mooncake
from kvmesh.cluster.measure.sim.run import blocks_per_replica
from kvmesh.cluster.measure.sim.scaling import compare_with_fixed, run_autoscaled, vary_rate
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.traces import read_mooncake

AUTOSCALE = AutoscaleConfig(scale_with_load=True, min_replicas=1, max_replicas=6, target_in_flight=32,
                            upscale_delay_s=5, downscale_delay_s=30)


def test_vary_rate_alternates_slow_and_fast_phases():
    reqs = [SimRequest(f"r{i}", float(t), [0], 1, 1) for i, t in enumerate([0, 5, 10, 15, 20, 25])]
    warped = [r.arrival_s for r in vary_rate(reqs, period_s=10, slow_factor=4)]
    # [0,10) slow: x4; [10,20) fast: +30 offset, x1; [20,30) slow again from 50
    assert warped == [0, 20, 40, 45, 50, 70]


@pytest.fixture(scope="module")
def setup(mooncake_trace):
    records = cut_trace(read_mooncake(mooncake_trace), 0, 800)
    config = SimConfig(num_replicas=AUTOSCALE.max_replicas)
    tokens = BlockTokenCache(config.engine.block_size, config.vocab_size, config.seed)

    def requests_of():
        return vary_rate(requests_from_mooncake(records, 1.0, config.engine.block_size), 60.0, 4.0)

    return records, config, blocks_per_replica(config, records), tokens, requests_of


def test_replicas_join_under_load_and_leave_when_it_falls(setup):
    records, config, per_replica, tokens, requests_of = setup
    run = run_autoscaled("cache_aware", requests_of(), config, per_replica, tokens, AUTOSCALE, startup_s=30)
    assert all(r.finished_s >= r.first_token_s >= r.arrival_s for r in run.requests)
    actions = [d["action"] for d in run.extra["decisions"]]
    assert "up" in actions and "down" in actions
    assert all(d["victim"] is not None for d in run.extra["decisions"] if d["action"] == "down")
    assert 1 < run.extra["max_live"] <= AUTOSCALE.max_replicas
    counts = [c for _, c in run.extra["timeline"]]
    assert min(counts) >= AUTOSCALE.min_replicas
    assert run.extra["left"], "no replica left"
    assert not set(run.extra["left"]) & set(run.router.index.replica_ids)  # dropped from the router's index

def test_autoscaled_uses_fewer_replica_seconds_than_a_fleet_sized_for_the_peak(setup):
    records, config, per_replica, tokens, requests_of = setup
    report = compare_with_fixed(requests_of, config, per_replica, tokens, AUTOSCALE, startup_s=30)
    fixed, scaled = report["fixed_peak"], report["autoscaled"]
    assert fixed["num_requests"] == scaled["num_requests"] == 800
    assert scaled["replica_seconds"] < 0.7 * fixed["replica_seconds"]
    assert scaled["ttft_s"]["p90"] > 0 and fixed["ttft_s"]["p90"] > 0  # the price is reported, not hidden


def test_kvmesh_sim_scaling_writes_the_comparison(mooncake_trace, tmp_path, capsys):
    import json

    from kvmesh.cluster.cli import main

    out = tmp_path / "scaling.json"
    assert main(["sim", "scaling", "--trace", str(mooncake_trace), "--limit", "300", "--max-replicas", "4",
                 "--target-in-flight", "16", "--target-queued-prefill-tokens", "16384", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["fixed_peak"]["num_requests"] == report["autoscaled"]["num_requests"] == 300
    assert report["autoscaled"]["replica_seconds"] < report["fixed_peak"]["replica_seconds"]
    printed = capsys.readouterr().out
    assert "fixed_peak" in printed and "autoscaled" in printed and str(out) in printed


def test_kvmesh_sim_scaling_says_when_a_request_outgrows_a_replica(mooncake_trace, tmp_path, capsys):
    """A cut whose pools are smaller than one of its requests is an error for people, not a traceback."""
    from kvmesh.cluster.cli import main

    out = tmp_path / "scaling.json"
    assert main(["sim", "scaling", "--trace", str(mooncake_trace), "--limit", "300", "--blocks-per-replica", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "kvmesh sim scaling:" in err and "blocks" in err and "Traceback" not in err
    assert not out.exists()
