"""Rooms whose walls are cut: within a package, no two rooms import each other.

A package's rooms are its sub-folders and its top-level modules (``replica/worker/``, ``replica/interfaces.py``);
an import of one room's module by another room's module is a door from the first to the second, whether it is
at module level, inside a function or under ``TYPE_CHECKING``. ARCHITECTURE.md draws each package's rooms with
one-way doors: a pair of rooms with doors both ways is a wall that was drawn by moving files, not cut.
test_import_graph.py finds any circle of rooms, at every depth; this one names each pair's doors both ways.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from .test_import_graph import ROOT, TOPS, kvmesh_modules


def _room(module: str) -> tuple[str, str] | None:
    """``kvmesh.replica.worker.input_batch`` -> ("replica", "worker"); a package's own ``__init__``: None."""
    parts = module.split(".")
    return (parts[1], parts[2]) if len(parts) > 2 else None


def _imported(module: str, path: Path, node: ast.AST) -> list[str]:
    """The dotted names an import statement names (relative ones resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - (node.level - 1)] + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def doors(root: Path = ROOT) -> dict[tuple[str, str, str], list[str]]:
    """(package, from room, to room) -> where the first room's modules import the second's ("module -> module")."""
    mods = kvmesh_modules(root)
    found: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for module, path in mods.items():
        here = _room(module)
        if here is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for name in _imported(module, path, node):
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                there = _room(name) if name else None
                if there is not None and there[0] == here[0] and there != here:
                    found[(here[0], here[1], there[1])].append(f"{module} -> {name}")
    return found


def two_way_pairs(package: str, root: Path = ROOT) -> list[str]:
    """The pairs of ``package``'s rooms that import each other, each with one import of either way."""
    found = doors(root)
    pairs = sorted({tuple(sorted((a, b))) for (pkg, a, b) in found if pkg == package and (pkg, b, a) in found})
    return [f"{a} <-> {b}  ({found[(package, a, b)][0]}; {found[(package, b, a)][0]})" for a, b in pairs]


@pytest.mark.parametrize("package", TOPS)
def test_no_two_rooms_of_a_package_import_each_other(package):
    pairs = two_way_pairs(package)
    assert pairs == [], f"{package}: rooms that import each other (cut one way):\n" + "\n".join(pairs)


def test_the_check_sees_a_pair_through_a_function_and_a_type_checking_import(tmp_path):
    """The check itself can fail: a module-level door one way, a lazy one and a type-only one back."""
    (tmp_path / "replica" / "engine").mkdir(parents=True)
    (tmp_path / "replica" / "worker").mkdir()
    (tmp_path / "replica" / "engine" / "llm_engine.py").write_text(
        "def make():\n    from kvmesh.replica.worker.model_runner import ModelRunner\n")
    (tmp_path / "replica" / "worker" / "model_runner.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvmesh.replica.engine import llm_engine\n")
    (tmp_path / "replica" / "interfaces.py").write_text("from kvmesh.replica.worker import model_runner\n")
    assert two_way_pairs("replica", tmp_path) == [
        "engine <-> worker  (kvmesh.replica.engine.llm_engine -> kvmesh.replica.worker.model_runner; "
        "kvmesh.replica.worker.model_runner -> kvmesh.replica.engine.llm_engine)"]


MEASURE_DOORS = {("benchmarks", "loadgen"), ("benchmarks", "workloads"), ("benchmarks", "shared_dir"),
                 ("loadgen", "workloads"), ("sim", "workloads"), ("workloads", "shared_dir")}
"""``cluster/measure/``'s rooms as ARCHITECTURE.md draws them: benchmarks -> loadgen -> workloads <- sim."""


def measure_doors(root: Path = ROOT) -> set[tuple[str, str]]:
    """(from room, to room) of the imports between ``cluster/measure/``'s rooms."""
    prefix = "kvmesh.cluster.measure."
    found = set()
    for module, path in kvmesh_modules(root).items():
        if not module.startswith(prefix):
            continue
        here = module[len(prefix):].split(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for name in _imported(module, path, node):
                if name.startswith(prefix) and (there := name[len(prefix):].split(".")[0]) != here:
                    found.add((here, there))
    return found


def test_measures_rooms_import_one_way_down():
    assert measure_doors() - MEASURE_DOORS == set()


def test_the_measure_check_sees_a_door_back_up(tmp_path):
    (tmp_path / "cluster" / "measure" / "workloads").mkdir(parents=True)
    (tmp_path / "cluster" / "measure" / "workloads" / "sessions.py").write_text(
        "from kvmesh.cluster.measure.loadgen.prompts import PromptMaker\n")
    assert measure_doors(tmp_path) - MEASURE_DOORS == {("workloads", "loadgen")}
