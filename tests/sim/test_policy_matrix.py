"""``kvmesh bench policy_matrix``'s runs with moved time scales (``--jitter``) and the tables ``kvmesh bench report``
makes of its files: the summary under the matrix and the sensitivity table over several runs."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks import policy_matrix
from kvmesh.cluster.measure.benchmarks.report.kinds import matrix_noise_table, matrix_table
from kvmesh.router.routing.policies import DEFAULT_POLICY

RIVAL = "cache_aware"


def _figures(hit: float, p50: float, p99: float) -> dict:
    return {"hit_rate": hit, "ttft_p50": p50, "ttft_p99": p99, "load_imbalance": 1.0}


def _matrix(jitter: float, rival_p99: float) -> dict:
    """Two cells: the default meets the verdict in ``a``; in ``b`` only while the rival's p99 is not lower."""
    cell = lambda p99: {"policies": {DEFAULT_POLICY: _figures(0.40, 0.10, 1.00),  # noqa: E731
                                     RIVAL: _figures(0.39, 0.10, p99)}}
    return {"default": DEFAULT_POLICY, "jitter": jitter,
            "cells": {"mooncake/1x/none": cell(1.0), "chatbot/2x/none": cell(rival_p99)}}


def test_jitter_moves_every_cells_time_scale_and_is_kept_in_the_file(tmp_path, monkeypatch):
    scales = []

    def fake_cell(workload, time_scale, kv_flags, replicas, miniature, niceness=10):
        scales.append(time_scale)
        return {"policies": {DEFAULT_POLICY: _figures(0.4, 0.1, 1.0)}, "wall_s": 0.0, "requests": 1, "command": ""}

    monkeypatch.setattr(policy_matrix, "run_cell", fake_cell)
    out = tmp_path / "m.json"
    policy_matrix.main(["--out", str(out), "--workloads", "chatbot", "--rates", "2x,3x", "--kv", "none",
                        "--jitter", "1e-4"])
    assert scales == [pytest.approx(0.5 * 1.0001), pytest.approx(1 / 3 * 1.0001)]
    assert json.loads(out.read_text())["jitter"] == 1e-4


def test_a_run_with_another_jitter_never_resumes_a_file(tmp_path, monkeypatch):
    """The hostile case: resuming a file with another --jitter would mix two matrices in one verdict."""
    monkeypatch.setattr(policy_matrix, "run_cell", lambda *a, **k: pytest.fail("ran a cell"))
    out = tmp_path / "m.json"
    out.write_text(json.dumps(_matrix(0.0, 1.0)))
    with pytest.raises(SystemExit, match="--jitter 0.0, not 0.0001"):
        policy_matrix.main(["--out", str(out), "--workloads", "chatbot", "--jitter", "1e-4"])


def test_the_matrix_table_ends_with_its_count_by_workload_rate_and_rival():
    text = matrix_table(_matrix(0.0, 0.5))
    assert text.splitlines()[-1] == (
        "The default meets the verdict in 1 of 2 cells (mooncake 1/1, chatbot 0/1; 1x 1/1, 2x 0/1). "
        f"Its 1 shortfalls (a metric in a cell): 1 to `{RIVAL}`.")


def test_the_sensitivity_table_counts_a_cell_that_flips_between_runs_as_met_in_some_only():
    runs = [_matrix(1e-4, 0.5), _matrix(0.0, 1.0), _matrix(-1e-4, 1.0)]  # chatbot: short in one run of three
    lines = matrix_noise_table(runs).splitlines()
    assert lines[2] == "| x 0.9999 (`--jitter=-0.0001`) | 2 of 2 |"
    assert lines[3] == "| as listed | 2 of 2 |"
    assert lines[4] == "| x 1.0001 (`--jitter=0.0001`) | 1 of 2 |"
    assert lines[5] == "| met in every run / in none / in some only | 1 / 0 / 1 |"
    rival = next(line for line in lines if line.startswith(f"| {RIVAL} |"))
    assert rival == f"| {RIVAL} | 0.0% / 0% | 50.0% / 100% |"  # p99: 0.5 -> 1.0 in one cell, unmoved in the other


def test_a_screen_refresh_runs_one_policy_again_in_every_cell_and_keeps_the_others(tmp_path):
    """A real cell on a small cut: the refreshed policy's figures are what a fresh run gives it, the other policies'
    are kept as stored, the cell's shortfalls are recomputed, and a finished refresh leaves no marker."""
    out = tmp_path / "screen.json"
    small = ["--limit", "120"]
    cell = policy_matrix.run_cell("mooncake", 1.0, small, 4, 8, niceness=0)
    fresh = cell["policies"][DEFAULT_POLICY]
    cell["policies"][DEFAULT_POLICY] = _figures(0.0, 9.0, 9.0)  # a stale formula's figures
    cell["policies"][RIVAL] = stored = _figures(0.5, 0.01, 0.02)
    cell["short"] = {}
    out.write_text(json.dumps({"default": DEFAULT_POLICY, "miniature": 8, "jitter": 0.0,
                               "cells": {"mooncake/1x/none": cell}}))
    policy_matrix.main(["--refresh", DEFAULT_POLICY, "--out", str(out), "--nice", "0"])
    done = json.loads(out.read_text())["cells"]["mooncake/1x/none"]
    assert done["policies"][DEFAULT_POLICY] == fresh
    assert done["policies"][RIVAL] == stored
    assert done["short"] == json.loads(json.dumps(policy_matrix.dominance(done["policies"])))  # as JSON stores it
    assert set(done["short"]) == {"hit_rate", "ttft_p50", "ttft_p99"}
    assert "refreshed" not in done and done["wall_s"] > cell["wall_s"]
