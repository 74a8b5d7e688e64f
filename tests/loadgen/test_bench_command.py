"""``kvmesh bench``: tools and component areas behind one command."""

from __future__ import annotations

import types

import pytest
from kvmesh.cluster.cli import main
from kvmesh.cluster.commands import bench


def test_help_lists_tools_and_installed_areas(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "load" in out and "compare-policies" in out
    for area in bench.available_areas():
        assert f"  {area}" in out
    assert "traces" not in bench.available_areas()  # a shared helper, not a benchmark


def test_every_listed_area_has_a_main():
    """A helper module beside the benchmarks is not offered as one (``kvmesh bench fake_answers`` crashed)."""
    import importlib.util

    for area in bench.available_areas():
        spec = importlib.util.find_spec(f"kvmesh.cluster.measure.benchmarks.{area}")
        with open(spec.origin) as f:
            assert "\ndef main(" in f.read(), f"kvmesh bench lists {area!r}, which has no main(argv)"


def test_area_dispatches_to_its_main_with_the_remaining_arguments(monkeypatch):
    seen = {}
    fake = types.SimpleNamespace(main=lambda argv: seen.setdefault("argv", argv) and 0)
    monkeypatch.setattr(bench, "available_areas", lambda: ["fakearea"])
    real_import = bench.importlib.import_module
    monkeypatch.setattr(bench.importlib, "import_module",
                        lambda name: fake if name.endswith(".fakearea") else real_import(name))
    assert main(["bench", "fakearea", "--quick", "--out", "x.json"]) == 0
    assert seen["argv"] == ["--quick", "--out", "x.json"]


def test_unknown_target_names_the_choices(capsys):
    assert main(["bench", "nonesuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'nonesuch'" in err and "load" in err


def test_bench_load_flags_are_the_documented_fields_of_its_dataclasses():
    from kvmesh.cluster.config.flags import config_from_args
    from kvmesh.cluster.measure.loadgen.load import build_parser
    from kvmesh.cluster.measure.loadgen.options import BENCH_LOAD_SCHEMA

    assert all(o.doc for o in BENCH_LOAD_SCHEMA.options), [o.dotted for o in BENCH_LOAD_SCHEMA.options if not o.doc]
    args = build_parser().parse_args(["--workload", "rag", "--num-documents", "3", "--no-ignore-eos"])
    config = config_from_args(args, BENCH_LOAD_SCHEMA, env={})
    assert (config.workload.workload, config.shape.num_documents, config.load.ignore_eos) == ("rag", 3, False)
