"""``kvmesh bench policy_matrix --seeds N``: seeds per cell, more while a cell is undecided, the figures a seed
keeps, the table ``kvmesh bench report`` makes of them; and one real cell on a small cut, end to end."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks import policy_matrix
from kvmesh.cluster.measure.benchmarks.support import matrix_seeds
from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import figures, run_matrix, seeds_to_run, table
from kvmesh.router.routing.policies import DEFAULT_POLICY

BASE = {"hit_share": 0.9, "ttft_mean": 1.0, "good_share": 0.8, "ttft_p50": 0.5, "ttft_p99": 4.0}


def _seed(rival_mean: float) -> dict[str, dict[str, float]]:
    return {DEFAULT_POLICY: dict(BASE), "dynamo": BASE | {"ttft_mean": rival_mean}}


def _cell(rival_means: list[float]) -> dict:
    return {"seeds": {str(k): _seed(m) for k, m in enumerate(rival_means)}, "wall_s": {}}


def test_a_cell_gets_its_minimum_then_more_only_while_undecided():
    assert seeds_to_run(_cell([1.0] * 3), DEFAULT_POLICY, 4, 6) == 3
    assert seeds_to_run(_cell([1.2] * 4), DEFAULT_POLICY, 4, 6) is None  # the default 17% faster every seed: pass
    assert seeds_to_run(_cell([0.9] * 4), DEFAULT_POLICY, 4, 6) is None  # 11% slower every seed: fail, settled
    straddling = [1.0, 0.96, 1.04, 0.98]  # mean TTFT differences spread across the 2% margin
    assert seeds_to_run(_cell(straddling), DEFAULT_POLICY, 4, 6) == 4
    assert seeds_to_run(_cell(straddling + [1.02, 0.97]), DEFAULT_POLICY, 4, 6) is None  # at the cap


def test_the_figures_of_a_seed_come_from_the_sim_report():
    p = {"hit_rate_vs_single_pool": 0.95, "ttft_s": {"mean": 1.5, "p50": 0.2, "p99": 9.0},
         "ttft_slo": {"slo_s": 2.0, "good_share": 0.85}}
    got = figures({"policies": {"a/host-tier": p, "a/no-tier": p | {"hit_rate_vs_single_pool": 0.1}}})
    assert got == {"a": {"hit_share": 0.95, "ttft_mean": 1.5, "good_share": 0.85, "ttft_p50": 0.2, "ttft_p99": 9.0}}
    with pytest.raises(ValueError, match="lacks the single-pool ceiling or the workload's TTFT SLO"):
        figures({"policies": {"a": {"ttft_s": {}}}})


def test_the_table_lists_a_failing_cell_with_its_intervals_and_counts_every_verdict():
    data = {"default": DEFAULT_POLICY, "cells": {"mooncake/2x/none": _cell([0.9] * 4) | {"wall_s": {"0": 120.0}},
                                                 "chatbot/2x/none": _cell([1.2] * 4),
                                                 "tool_agent/2x/none": _cell([1.0, 0.96, 1.04, 0.98])}}
    lines = table(data, 72).splitlines()
    assert lines[2] == ("| mooncake/2x/none | 4 (2 min) | fail | **dynamo TTFT mean +11.1% [+11.1, +11.1]** | 0/1 |")
    assert lines[3] == "| chatbot/2x/none | 4 (0 min) | pass | - | 1/1 |"
    assert lines[4].startswith("| tool_agent/2x/none | 4 (0 min) | undecided | dynamo TTFT mean +0.6% [")
    assert lines[4].endswith("(undecided) | 0/1 |")
    assert lines[-1] == ("1 pass, 1 fail, 1 undecided (of 3 cells with their seeds); 69 of the matrix's 72 cells "
                         "have no verdict yet (0 of them running).")
    assert table(data, 3).splitlines()[-1] == ("1 pass, 1 fail, 1 undecided (of 3 cells with their seeds); every cell "
                                                "of the matrix has run its seeds.")
    data |= {"min_seeds": 10, "cells": {"chatbot/2x/none": _cell([1.2] * 4)}}
    lines = table(data, 72).splitlines()
    assert lines[2] == "| chatbot/2x/none | 4 (0 min) | pass so far (4 of 10 seeds) | - | 1/1 |"
    assert lines[-1].startswith("0 pass, 0 fail, 0 undecided (of 0 cells with their seeds); 72 of the matrix's 72 "
                                "cells have no verdict yet (1 of them running).")


def test_run_matrix_writes_each_seed_and_extends_an_undecided_cell(tmp_path, monkeypatch):
    means = iter([1.0, 0.96, 1.04, 0.98, 1.02, 0.97, 1.2, 1.2])
    ran = []

    def fake_seed(args, niceness, timeout_s):
        ran.append(args[args.index("--arrival-seed") + 1])
        return _seed(next(means)), 1.0

    monkeypatch.setattr(matrix_seeds, "run_seed", fake_seed)
    out = tmp_path / "v.json"
    run_matrix(out, [("chatbot/2x/none", 0.5, [])], default=DEFAULT_POLICY, policies=[DEFAULT_POLICY, "dynamo"],
               min_seeds=4, max_seeds=6, replicas=16, niceness=0, timeout_s=10.0, budget_s=None)
    assert ran == ["0", "1", "2", "3", "4", "5"]
    cell = json.loads(out.read_text())["cells"]["chatbot/2x/none"]
    assert cell["command"].startswith("kvmesh sim --workload chatbot --num-replicas 16 --time-scale 0.5 "
                                      "--arrival-seed K --policies cache_aware_tokens,dynamo")
    with pytest.raises(SystemExit, match="another comparison"):
        run_matrix(out, [], default=DEFAULT_POLICY, policies=[DEFAULT_POLICY], min_seeds=4, max_seeds=6,
                   replicas=16, niceness=0, timeout_s=10.0, budget_s=None)


def test_the_seeds_flags_reach_the_runner(tmp_path, monkeypatch):
    got = {}
    monkeypatch.setattr(matrix_seeds, "run_matrix", lambda out, cells, **kw: got.update(out=out, cells=cells, **kw))
    policy_matrix.main(["--seeds", "10", "--workloads", "mooncake", "--rates", "2x,3x", "--kv", "none",
                        "--policies", f"{DEFAULT_POLICY},sglang", "--out", str(tmp_path / "v.json")])
    assert [key for key, _, _ in got["cells"]] == ["mooncake/2x/none", "mooncake/3x/none"]
    assert (got["min_seeds"], got["max_seeds"], got["policies"]) == (10, 20, [DEFAULT_POLICY, "sglang"])
    with pytest.raises(SystemExit, match="must name the default"):
        policy_matrix.main(["--seeds", "10", "--policies", "sglang", "--out", str(tmp_path / "v.json")])
    policy_matrix.main(["--seeds", "10", "--workloads", "chatbot", "--rates", "2x", "--kv", "pull25G",
                        "--policy-kwargs", "price_pulls=true", "--out", str(tmp_path / "o.json")])
    assert got["cells"][0][2] == [*policy_matrix.KV["pull25G"], "--policy-kwargs", "price_pulls=true"]


def test_one_real_cell_on_a_small_cut(tmp_path):
    """``kvmesh sim`` processes for real (a 300-request cut of Mooncake on 4 replicas, 2 seeds): figures for every
    policy."""
    out = tmp_path / "v.json"
    run_matrix(out, [("mooncake/1x/none", 1.0, ["--limit", "300"])], default=DEFAULT_POLICY,
               policies=[DEFAULT_POLICY, "sglang"], min_seeds=2, max_seeds=2, replicas=4, niceness=0,
               timeout_s=300.0, budget_s=None)
    seeds = json.loads(out.read_text())["cells"]["mooncake/1x/none"]["seeds"]
    assert sorted(seeds) == ["0", "1"] and sorted(seeds["0"]) == sorted([DEFAULT_POLICY, "sglang"])
    assert seeds["0"][DEFAULT_POLICY]["ttft_mean"] != seeds["1"][DEFAULT_POLICY]["ttft_mean"]  # arrivals redrawn
    assert 0 < seeds["0"][DEFAULT_POLICY]["good_share"] <= 1
    assert "| mooncake/1x/none | 2 (" in table(json.loads(out.read_text()), 72)


def test_the_table_merges_the_files_of_a_matrix_split_over_processes():
    from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import merged

    one = {"default": DEFAULT_POLICY, "policies": [DEFAULT_POLICY, "dynamo"], "cells": {"a/2x/none": _cell([1.2] * 4)}}
    other = one | {"cells": {"a/3x/none": _cell([0.9] * 4)}}
    assert list(merged([one, other])["cells"]) == ["a/2x/none", "a/3x/none"]
    with pytest.raises(ValueError, match="cells in two verdict files: a/2x/none"):
        merged([one, one])
    fewer = merged([one, other | {"policies": [DEFAULT_POLICY]}])  # a file whose rival is being run again
    assert list(fewer["cells"]) == ["a/2x/none", "a/3x/none"]
    with pytest.raises(ValueError, match="different defaults"):
        merged([one, other | {"default": "round_robin"}])


def test_refresh_reruns_a_rival_on_every_stored_seed_and_keeps_the_others(tmp_path, monkeypatch):
    from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import refresh_matrix

    out = tmp_path / "v.json"
    cell = _cell([1.2, 1.2, 1.2]) | {"command": "kvmesh sim --workload chatbot --time-scale 0.5 --arrival-seed K "
                                                "--policies cache_aware_tokens,dynamo --no-plot --peer-pulls"}
    out.write_text(json.dumps({"default": DEFAULT_POLICY, "policies": [DEFAULT_POLICY, "dynamo", "sglang"],
                               "cells": {"chatbot/2x/none": cell}}))
    ran = []

    def fake_seed(args, niceness, timeout_s):
        ran.append(args)
        if len(ran) == 2:
            raise KeyboardInterrupt  # stopped mid-way: the first seed is kept and marked
        return {p: BASE | {"ttft_mean": 0.5} for p in args[args.index("--policies") + 1].split(",")}, 1.0

    monkeypatch.setattr(matrix_seeds, "run_seed", fake_seed)
    with pytest.raises(KeyboardInterrupt):
        refresh_matrix(out, ["dynamo"], niceness=0, timeout_s=10.0, budget_s=None)
    assert ran[0] == ["sim", "--workload", "chatbot", "--time-scale", "0.5", "--arrival-seed", "0", "--policies",
                      "dynamo", "--no-plot", "--peer-pulls"]
    mid = json.loads(out.read_text())
    assert mid["cells"]["chatbot/2x/none"]["refreshing"] == {"policies": ["dynamo"], "seeds": ["0"]}
    with pytest.raises(SystemExit, match="mid-refresh"):  # no new seeds onto half-refreshed figures
        run_matrix(out, [], default=DEFAULT_POLICY, policies=[DEFAULT_POLICY, "dynamo", "sglang"], min_seeds=4,
                   max_seeds=6, replicas=16, niceness=0, timeout_s=10.0, budget_s=None)
    with pytest.raises(SystemExit, match="mid-refresh"):
        refresh_matrix(out, ["sglang"], niceness=0, timeout_s=10.0, budget_s=None)
    refresh_matrix(out, ["dynamo"], niceness=0, timeout_s=10.0, budget_s=None)  # resumes at seed 1
    assert [a[a.index("--arrival-seed") + 1] for a in ran] == ["0", "1", "1", "2"]
    seeds = json.loads(out.read_text())["cells"]["chatbot/2x/none"]
    assert "refreshing" not in seeds
    assert all(s["dynamo"]["ttft_mean"] == 0.5 and s[DEFAULT_POLICY] == BASE for s in seeds["seeds"].values())
    refresh_matrix(out, [DEFAULT_POLICY], niceness=0, timeout_s=10.0, budget_s=None)  # the default's new rule
    assert all(s[DEFAULT_POLICY]["ttft_mean"] == 0.5 and s["dynamo"]["ttft_mean"] == 0.5
               for s in json.loads(out.read_text())["cells"]["chatbot/2x/none"]["seeds"].values())
    assert ran[-1][ran[-1].index("--policies") + 1] == DEFAULT_POLICY
    refresh_matrix(out, ["llmd"], niceness=0, timeout_s=10.0, budget_s=None)  # a rival the file lacks: added
    done = json.loads(out.read_text())
    assert done["policies"] == [DEFAULT_POLICY, "dynamo", "sglang", "llmd"]
    assert "--policies cache_aware_tokens,dynamo,sglang,llmd --no-plot" in done["cells"]["chatbot/2x/none"]["command"]
    assert ran[-1][ran[-1].index("--policies") + 1] == "llmd"
    assert all(s["llmd"]["ttft_mean"] == 0.5 for s in done["cells"]["chatbot/2x/none"]["seeds"].values())


def test_a_policy_run_alone_gives_the_figures_it_gives_beside_the_others(tmp_path):
    """What ``--refresh`` rests on: a seed's run of one policy does not depend on the policies run beside it."""
    out = tmp_path / "v.json"
    run_matrix(out, [("mooncake/1x/none", 1.0, ["--limit", "200"])], default=DEFAULT_POLICY,
               policies=[DEFAULT_POLICY, "sglang", "llmd"], min_seeds=2, max_seeds=2, replicas=4, niceness=0,
               timeout_s=300.0, budget_s=None)
    cell = json.loads(out.read_text())["cells"]["mooncake/1x/none"]
    alone, _ = matrix_seeds.run_seed(matrix_seeds.refresh_command(cell, "1", ["llmd"]), 0, 300.0)
    assert alone == {"llmd": cell["seeds"]["1"]["llmd"]}


def test_a_cell_without_a_rival_the_others_compare_says_so_and_is_counted_apart():
    both = {str(k): _seed(1.2) | {"sglang": dict(BASE) | {"ttft_mean": 0.9}} for k in range(4)}
    data = {"default": DEFAULT_POLICY, "cells": {"a/2x/none": {"seeds": both, "wall_s": {}},
                                                 "a/3x/none": _cell([1.2] * 4)}}
    lines = table(data, 2).splitlines()
    assert lines[2].startswith("| a/2x/none | 4 (0 min) | fail | **sglang TTFT mean")
    assert lines[3] == "| a/3x/none | 4 (0 min) | pass (without sglang) | - | 1/1 |"
    assert lines[-1] == ("0 pass, 1 fail, 0 undecided (of 1 cell with their seeds and every peer's formula); without "
                         "sglang, whose formulas are not yet run again on them: 1 pass, 0 fail, 0 undecided (of 1); "
                         "every cell of the matrix has run its seeds.")


def test_a_variant_runs_the_default_with_its_knob_on_the_stored_seeds_beside_the_stored_rivals(tmp_path, monkeypatch):
    from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import variant_matrix

    source, out = tmp_path / "verdict.json", tmp_path / "variants" / "clamp.json"
    cell = _cell([1.2, 1.2, 1.2, 1.2]) | {"command": "kvmesh sim --workload chatbot --time-scale 0.5 --arrival-seed K "
                                                     "--policies cache_aware_tokens,dynamo --no-plot"}
    source.write_text(json.dumps({"default": DEFAULT_POLICY, "policies": [DEFAULT_POLICY, "dynamo"],
                                  "cells": {"chatbot/2x/none": cell, "chatbot/3x/none": cell}}))
    ran = []

    def fake_seed(args, niceness, timeout_s):
        ran.append(args)
        if len(ran) == 2:
            raise KeyboardInterrupt  # stopped mid-way: resumed at the next seed
        return {DEFAULT_POLICY: BASE | {"ttft_mean": 1.5}}, 2.0

    monkeypatch.setattr(matrix_seeds, "run_seed", fake_seed)
    with pytest.raises(SystemExit, match="--policy-kwargs or --router-kwargs"):
        variant_matrix(source, out, ["chatbot/2x/none"], [], seeds=None, niceness=0, timeout_s=1.0, budget_s=None)
    with pytest.raises(SystemExit, match="at least 2"):
        variant_matrix(source, out, ["chatbot/2x/none"], ["churn_clamp=4"], seeds=1, niceness=0, timeout_s=1.0,
                       budget_s=None)
    with pytest.raises(SystemExit, match="no cell chatbot/1x/none"):
        variant_matrix(source, out, ["chatbot/1x/none"], ["churn_clamp=4"], seeds=None, niceness=0, timeout_s=1.0,
                       budget_s=None)
    with pytest.raises(KeyboardInterrupt):
        variant_matrix(source, out, ["chatbot/2x/none"], ["churn_clamp=4"], seeds=3, niceness=0, timeout_s=1.0,
                       budget_s=None)
    variant_matrix(source, out, ["chatbot/2x/none"], ["churn_clamp=4"], seeds=3, niceness=0, timeout_s=1.0,
                   budget_s=None)
    assert ran[0] == ["sim", "--workload", "chatbot", "--time-scale", "0.5", "--arrival-seed", "0", "--policies",
                      DEFAULT_POLICY, "--no-plot", "--policy-kwargs", "churn_clamp=4"]
    assert [a[a.index("--arrival-seed") + 1] for a in ran] == ["0", "1", "1", "2"]  # the first 3 stored seeds
    data = json.loads(out.read_text())
    assert list(data["cells"]) == ["chatbot/2x/none"] and list(data["cells"]["chatbot/2x/none"]["seeds"]) == [
        "0", "1", "2"]
    assert all(s[DEFAULT_POLICY]["ttft_mean"] == 1.5 and s["dynamo"]["ttft_mean"] == 1.2
               for s in data["cells"]["chatbot/2x/none"]["seeds"].values())
    assert data["cells"]["chatbot/2x/none"]["wall_s"] == {"0": 2.0, "1": 2.0, "2": 2.0}
    assert json.loads(source.read_text())["cells"]["chatbot/2x/none"] == cell  # the source untouched
    variant_matrix(source, out, ["chatbot/2x/none"], ["churn_clamp=4"], seeds=3, niceness=0, timeout_s=1.0,
                   budget_s=None)
    assert len(ran) == 4  # finished: nothing run again
    lines = table(data, 72).splitlines()
    assert lines[2].startswith("| chatbot/2x/none | 3 (0 min) | fail | **dynamo TTFT mean")
    assert lines[-1] == (f"0 pass, 1 fail, 0 undecided (of 1 cell with their seeds); the default with churn_clamp=4, "
                         f"on the seeds of {source}.")


def test_the_variant_flags_reach_the_runner(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(matrix_seeds, "variant_matrix", lambda source, out, keys, knobs, **kw: seen.update(
        source=source, out=out, keys=keys, knobs=knobs, **kw))
    policy_matrix.main(["--variant-of", "v.json", "--workloads", "chatbot,tool_agent", "--rates", "2x", "--kv", "none",
                        "--policy-kwargs", "churn_clamp=4", "--router-kwargs", "predict_hold_s=30", "--seeds", "4",
                        "--out", str(tmp_path / "o.json")])
    assert seen["keys"] == ["chatbot/2x/none", "tool_agent/2x/none"] and seen["knobs"] == ["churn_clamp=4"]
    assert seen["router_knobs"] == ["predict_hold_s=30"]
    assert seen["seeds"] == 4 and str(seen["source"]) == "v.json"
    with pytest.raises(SystemExit, match="name it with --out"):
        policy_matrix.main(["--variant-of", "v.json", "--policy-kwargs", "churn_clamp=4"])


def test_a_router_field_varies_through_the_simulators_flag_of_its_name(tmp_path, monkeypatch):
    from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import router_flag, variant_matrix

    assert router_flag("predict_hold_s=30") == "--predict-hold-s 30"
    for bad in ("predict_hold_s", "=30", "predict_hold_s=", "a b=1"):
        with pytest.raises(SystemExit, match="NAME=VALUE"):
            router_flag(bad)
    source, out = tmp_path / "verdict.json", tmp_path / "hold.json"
    cell = _cell([1.2, 1.2]) | {"command": "kvmesh sim --workload mooncake --arrival-seed K --policies "
                                           f"{DEFAULT_POLICY},dynamo --no-plot"}
    source.write_text(json.dumps({"default": DEFAULT_POLICY, "policies": [DEFAULT_POLICY, "dynamo"],
                                  "cells": {"mooncake/2x/none": cell}}))
    ran = []
    monkeypatch.setattr(matrix_seeds, "run_seed", lambda args, niceness, timeout_s: (
        ran.append(args) or {DEFAULT_POLICY: BASE}, 1.0))
    variant_matrix(source, out, ["mooncake/2x/none"], [], seeds=None, niceness=0, timeout_s=1.0, budget_s=None,
                   router_knobs=["predict_hold_s=30"])
    assert ran[0][-2:] == ["--predict-hold-s", "30"] and len(ran) == 2
    assert table(json.loads(out.read_text()), 72).splitlines()[-1].endswith(
        f"the default with router.predict_hold_s=30, on the seeds of {source}.")


def test_a_variant_runs_on_a_cell_a_refresh_finished_but_not_on_one_it_is_still_running(tmp_path, monkeypatch):
    """A file mid-refresh (a rival run again on a new formula, cell by cell): a cell every seed of which has run the
    new formula is whole and takes a variant; a cell part-way would pair the variant with two formulas at once."""
    from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import variant_matrix

    command = "kvmesh sim --workload chatbot --time-scale 0.5 --arrival-seed K --policies cache_aware_tokens --no-plot"
    done = _cell([1.2, 1.2]) | {"command": command, "refreshing": {"policies": ["dynamo"], "seeds": ["0", "1"]}}
    part = done | {"refreshing": {"policies": ["dynamo"], "seeds": ["0"]}}
    source = tmp_path / "verdict.json"
    source.write_text(json.dumps({"default": DEFAULT_POLICY, "policies": [DEFAULT_POLICY, "dynamo"],
                                  "cells": {"chatbot/2x/none": done, "chatbot/3x/none": part}}))
    monkeypatch.setattr(matrix_seeds, "run_seed", lambda args, niceness, timeout_s: ({DEFAULT_POLICY: BASE}, 1.0))
    with pytest.raises(SystemExit, match="mid-refresh in chatbot/3x/none"):
        variant_matrix(source, tmp_path / "a.json", ["chatbot/3x/none"], ["churn_clamp=4"], seeds=None, niceness=0,
                       timeout_s=1.0, budget_s=None)
    variant_matrix(source, tmp_path / "b.json", ["chatbot/2x/none"], ["churn_clamp=4"], seeds=None, niceness=0,
                   timeout_s=1.0, budget_s=None)
    assert list(json.loads((tmp_path / "b.json").read_text())["cells"]["chatbot/2x/none"]["seeds"]) == ["0", "1"]
