"""`bench load --duration` bounds a run in time; results go outside the repository by default; plots say
how the run was made."""

from __future__ import annotations

import json
from pathlib import Path

from kvmesh.cluster.measure.loadgen.load import build_parser, main, results_dir, run_async, run_parameters

REPO = Path(__file__).resolve().parents[2]


async def test_duration_stops_sending_new_requests(fake_server):
    args = build_parser().parse_args(["--url", fake_server.url, "--no-progress", "--no-plot", "--num-requests",
                                      "3000", "--max-prompt-tokens", "32", "--max-tokens", "2",
                                      "--concurrency", "2", "--duration", "0.5"])
    run = await run_async(args)
    s = run["summary"]
    assert 0 < s["requests"] < 3000 and s["turns_skipped_by_duration"] > 0
    assert s["duration_s"] < 5.0  # stopped by --duration, long before the workload ended
    assert run["config"]["duration"] == 0.5


def test_default_results_dir_is_outside_the_repository(monkeypatch, tmp_path):
    monkeypatch.delenv("KVMESH_RESULTS_DIR", raising=False)
    default = Path(build_parser().get_default("out"))
    assert REPO not in default.resolve().parents and default.parent == results_dir()
    monkeypatch.setenv("KVMESH_RESULTS_DIR", str(tmp_path))
    assert results_dir() == tmp_path


def test_run_parameters_name_the_settings_that_shape_a_run():
    line = run_parameters({"workload": "chatbot", "mode": "closed", "concurrency": 8, "num_requests": 64,
                           "rate": None, "max_tokens": 32, "url": "x"})
    assert line == "workload=chatbot, mode=closed, concurrency=8, num_requests=64, max_tokens=32"


def test_plot_is_written_with_percentile_marks(fake_server, tmp_path, monkeypatch):
    import matplotlib.axes

    drawn: list[str] = []
    original = matplotlib.axes.Axes.axvline

    def spy(self, x=0, *a, **kw):
        drawn.append(kw.get("label", ""))
        return original(self, x, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", spy)
    out = tmp_path / "load.json"
    rc = main(["--url", fake_server.url, "--num-requests", "4", "--max-prompt-tokens", "32", "--max-tokens", "2",
               "--out", str(out), "--no-progress"])
    assert rc == 0 and json.loads(out.read_text())["summary"]["ok"] == 4
    assert out.with_suffix(".png").stat().st_size > 1000
    assert [label.split()[0] for label in drawn] == ["p50", "p99"]  # on the TTFT CDF
