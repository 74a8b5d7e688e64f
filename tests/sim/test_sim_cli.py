"""``kvmesh sim`` end to end on a tiny cut, and its errors."""

from __future__ import annotations

import json

from kvmesh.cluster.cli import main


def test_sim_writes_json_table_and_plot_for_every_policy_it_runs_by_default(mooncake_trace, tmp_path, capsys):
    from kvmesh.cluster.measure.sim.router import default_policies

    out = tmp_path / "sim.json"
    rc = main(["sim", "--trace", str(mooncake_trace), "--start", "3800", "--limit", "120",
               "--max-prompt-blocks", "32", "--num-replicas", "4", "--block-size", "32", "--time-scale", "0.5",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert list(report["policies"]) == default_policies()  # the peers' formulas run when --policies names them
    assert 0 < report["ceilings"]["single_pool_hit_rate"] <= report["ceilings"]["infinite_cache_hit_rate"]
    assert out.with_suffix(".png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert all(name in printed for name in default_policies())


def test_sim_reports_a_malformed_trace_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"oops"\n')
    assert main(["sim", "--trace", str(trace), "--out", str(tmp_path / "o.json"), "--no-progress"]) == 2
    assert "t.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_sim_rejects_unknown_policy_and_cost_field(mooncake_trace, tmp_path, capsys):
    args = ["sim", "--trace", str(mooncake_trace), "--limit", "5", "--out", str(tmp_path / "o.json"), "--no-progress"]
    assert main([*args, "--policies", "cache_awar"]) == 2
    assert "unknown policies ['cache_awar']" in capsys.readouterr().err
    assert main([*args, "--cost", "prefill_per_token=1"]) == 2
    assert "unknown CostModel field" in capsys.readouterr().err


def test_sim_flags_are_the_documented_fields_of_its_dataclasses():
    import argparse

    from kvmesh.cluster.config.flags import add_config_arguments, config_from_args
    from kvmesh.cluster.measure.sim.options import SCALING_SCHEMA, SIM_SCHEMA

    for schema in (SIM_SCHEMA, SCALING_SCHEMA):
        assert all(o.doc for o in schema.options), [o.dotted for o in schema.options if not o.doc]
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, SIM_SCHEMA, config_file=False)
    command = config_from_args(parser.parse_args(["--vocab-size", "300", "--no-ceilings", "--cost",
                                                  "step_overhead_s=0.01"]),
                               SIM_SCHEMA, env={})
    assert (command.sim.vocab_size, command.compare.ceilings, command.compare.cost) == (300, False,
                                                                                        {"step_overhead_s": 0.01})


def test_sim_with_a_host_tier_compares_each_policy_with_and_without_it(mooncake_trace, tmp_path, capsys):
    out = tmp_path / "sim.json"
    rc = main(["sim", "--trace", str(mooncake_trace), "--start", "3800", "--limit", "120",
               "--max-prompt-blocks", "32", "--num-replicas", "4", "--block-size", "32", "--time-scale", "0.5",
               "--capacity-fraction", "0.15", "--offload-capacity-fraction", "0.85", "--policies", "cache_aware",
               "--out", str(out), "--no-progress", "--no-plot"])
    assert rc == 0
    runs = json.loads(out.read_text())["policies"]
    without, with_tier = runs["cache_aware/no-tier"], runs["cache_aware/host-tier"]
    assert without["host_hit_rate"] == 0.0 and with_tier["host_hit_rate"] > 0
    assert with_tier["hit_rate"] > without["hit_rate"]
    assert "host tier" in capsys.readouterr().out
    tier_only = tmp_path / "tier_only.json"
    assert main(["sim", "--trace", str(mooncake_trace), "--start", "3800", "--limit", "120",
                 "--max-prompt-blocks", "32", "--num-replicas", "4", "--block-size", "32", "--time-scale", "0.5",
                 "--capacity-fraction", "0.15", "--offload-capacity-fraction", "0.85", "--policies", "cache_aware",
                 "--no-offload-compare", "--out", str(tier_only), "--no-progress", "--no-plot"]) == 0
    alone = json.loads(tier_only.read_text())["policies"]
    assert list(alone) == ["cache_aware/host-tier"]  # the tier's run only, as the policy matrix's host cells read
    figures = ("hit_rate", "host_hit_rate", "ttft_s", "hit_rate_vs_single_pool")  # the same run, timing aside
    assert [alone["cache_aware/host-tier"][k] for k in figures] == [with_tier[k] for k in figures]
