"""The tables of README.md, BENCHMARKS.md and docs/gpu-cluster.md are what ``kvmesh bench report`` generates from the
results
files named above them (cluster/measure/benchmarks/report/): a figure typed by hand, or a results file re-run
without regenerating its table, fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvmesh.cluster.measure.benchmarks.report import BLOCK, DOCS, main, render
from kvmesh.cluster.measure.benchmarks.report.kinds import sim_table
from kvmesh.router.routing.policies import DEFAULT_POLICY

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "regenerate: .venv/bin/kvmesh bench report"


@pytest.mark.parametrize("doc", DOCS)
def test_every_generated_table_is_its_results_file(doc):
    text = (ROOT / doc).read_text()
    regenerated, changed = render(text, ROOT)
    assert changed == [], f"{doc}: {changed}; {REGENERATE}"
    assert regenerated == text


def test_the_readme_headline_table_is_generated():
    kinds = [m.group(2) for m in BLOCK.finditer((ROOT / "README.md").read_text())]
    assert "sim" in kinds


def _report(hit: float) -> dict:
    policy = {"hit_rate": hit, "ttft_s": {"p50": 0.067, "p99": 4.71}, "load_imbalance": 1.05}
    return {"ceilings": {"single_pool_hit_rate": 0.45}, "policies": {DEFAULT_POLICY: policy}}


def test_a_typed_figure_differs_and_the_check_names_its_table(tmp_path):
    """The hostile case: a table edited by hand (one figure) is found, named, and rewritten from the file."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "sim.json").write_text(json.dumps(_report(0.444)))
    table = sim_table(_report(0.444))
    typed = table.replace("44.4%", "45.0%")
    assert typed != table
    for name in DOCS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)  # docs/ for a guide's tables
        (tmp_path / name).write_text(f"before\n<!-- table: sim results/sim.json -->\n{typed}\n<!-- /table -->\nafter\n")
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert "45.0%" in (tmp_path / "README.md").read_text()  # --check changes nothing
    assert main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == \
        f"before\n<!-- table: sim results/sim.json -->\n{table}\n<!-- /table -->\nafter\n"
    assert main(["--check", "--root", str(tmp_path)]) == 0


def test_a_missing_results_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="results/gone.json"):
        render("<!-- table: sim results/gone.json -->\n| x |\n<!-- /table -->", tmp_path)


def test_an_unknown_kind_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="'plot'"):
        render("<!-- table: plot results/x.json -->\n| x |\n<!-- /table -->", tmp_path)


def test_a_pattern_with_no_results_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"results/gone\*\.json"):
        render("<!-- table: queue_flood results/gone*.json -->\n| x |\n<!-- /table -->", tmp_path)


def test_a_pattern_gives_a_row_per_file_in_name_order(tmp_path):
    """Each matching run is a row; a typed row differs from its file."""
    (tmp_path / "results").mkdir()
    for name, served in (("b", 9), ("a", 50)):
        light = {"sent": 50, "served": served, "served_fraction": served / 50, "latency_p50_s": 0.1,
                 "latency_p90_s": 0.2}
        doc = {"command": f"run {name}", "label": name, "verdict": {"pass": served == 50}, "cpu_seconds": {},
               "summary": {"light": light, "flood": {"served": 1, "refused": {"queue_full": 5}},
                           "flood_share": 0.5, "flood_fair_share": 0.5}}
        (tmp_path / "results" / f"q_{name}.json").write_text(json.dumps(doc))
    text, changed = render("<!-- table: queue_flood results/q_*.json -->\n<!-- /table -->", tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| `run")]
    assert changed and [r.split("`")[1] for r in rows] == ["run a", "run b"]
    assert "50 of 50 (100%)" in rows[0] and rows[0].endswith("PASS |") and rows[1].endswith("FAIL |")
    assert render(text, tmp_path) == (text, [])
