"""``kvmesh bench report``'s ``replications`` kind: a mean and 95% interval per policy over arrival seeds."""

from __future__ import annotations

import math

import pytest
from kvmesh.cluster.measure.benchmarks.headline import interval, table


def report(seed: int, figures: dict[str, float]) -> dict:
    return {"trace": {"arrivals": f"arrival seed {seed}: distinct timestamps"},
            "policies": {name: {"hit_rate_vs_single_pool": v, "ttft_s": {"mean": v, "p50": v, "p99": v}}
                         for name, v in figures.items()}}


def test_interval_is_students_t():
    mean, half = interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3))
    assert interval([5.0]) == (5.0, 0.0)


def test_table_puts_the_default_first_with_mean_and_interval():
    docs = [report(k, {"round_robin": 0.1 * (k + 1), "cache_aware_tokens": 0.5}) for k in range(3)]
    lines = table(docs).splitlines()
    assert lines[0].startswith("| policy (3 arrival seeds) |")
    assert lines[2] == ("| **cache_aware_tokens** (the default) | 50.0% ± 0.0 | 0.500 s ± 0.000 | 0.500 s ± 0.000 "
                        "| 0.50 s ± 0.00 |")
    half = 4.303 * 0.1 / math.sqrt(3)
    assert lines[3] == (f"| round_robin | 20.0% ± {100 * half:.1f} | 0.200 s ± {half:.3f} | 0.200 s ± {half:.3f} "
                        f"| 0.20 s ± {half:.2f} |")


def test_table_refuses_reports_that_are_not_replications():
    with pytest.raises(ValueError, match="distinct --arrival-seed"):
        table([report(1, {"random": 0.1}), report(1, {"random": 0.2})])
    with pytest.raises(ValueError, match="same policies"):
        table([report(1, {"random": 0.1}), report(2, {"dynamo": 0.2})])


def test_headline_runs_each_missing_seed_once(tmp_path, monkeypatch):
    from kvmesh.cluster.measure.benchmarks import headline

    (tmp_path / "sim_mooncake_2x_seed1.json").write_text("{}")
    ran = []
    monkeypatch.setattr(headline.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    assert headline.main(["--seeds", "3", "--out-dir", str(tmp_path)]) == 0
    assert [cmd[cmd.index("--arrival-seed") + 1] for cmd in ran] == ["0", "2"]
    sim = ran[0][ran[0].index("sim"):]
    assert sim[1:5] == ["--num-replicas", "16", "--time-scale", "0.5"]
    assert sim[sim.index("--policies") + 1].split(",")[:5] == ["cache_aware_tokens", "dynamo", "llmd", "llmd_precise",
                                                                "sglang"]


def test_headline_refresh_puts_a_policys_new_run_in_place_on_every_seed(tmp_path, monkeypatch):
    import json

    from kvmesh.cluster.measure.benchmarks import headline

    for k in range(2):
        (tmp_path / f"sim_mooncake_2x_seed{k}.json").write_text(
            json.dumps(report(k, {"cache_aware_tokens": 0.5, "llmd": 0.1, "random": 0.2})))
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd)
        out = cmd[cmd.index("--out") + 1]
        (tmp_path / "fresh").mkdir(exist_ok=True)
        with open(out, "w") as f:
            json.dump(report(0, {"llmd": 0.9}), f)

    monkeypatch.setattr(headline.subprocess, "run", fake_run)
    assert headline.main(["--seeds", "2", "--out-dir", str(tmp_path), "--refresh", "llmd"]) == 0
    assert [cmd[cmd.index("--policies") + 1] for cmd in ran] == ["llmd", "llmd"]
    for k in range(2):
        doc = json.loads((tmp_path / f"sim_mooncake_2x_seed{k}.json").read_text())
        assert list(doc["policies"]) == ["cache_aware_tokens", "llmd", "random"]  # the order kept
        assert doc["policies"]["llmd"]["ttft_s"]["mean"] == 0.9 and doc["policies"]["random"]["ttft_s"]["mean"] == 0.2
        assert doc["refreshed"] == ["llmd"] and doc["trace"]["arrivals"].startswith(f"arrival seed {k}")
    headline.main(["--seeds", "2", "--out-dir", str(tmp_path), "--refresh", "llmd"])
    assert len(ran) == 2  # done already: nothing run again
    with pytest.raises(SystemExit, match="policies of the comparison"):
        headline.main(["--seeds", "2", "--out-dir", str(tmp_path), "--refresh", "vllm"])
