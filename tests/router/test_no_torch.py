"""Layering: router/ never imports torch, and takes from replica/ only the torch-free serving core and OpenAI layer."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import kvmesh.replica.openai
import kvmesh.replica.serving
import kvmesh.router

ALLOWED_FROM_REPLICA = ("kvmesh.replica.serving", "kvmesh.replica.openai")


def _modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_router_and_openai_layer_import_without_torch():
    modules = _modules(kvmesh.router) + _modules(kvmesh.replica.openai) + _modules(kvmesh.replica.serving)
    assert "kvmesh.router.control.router_server" in modules and "kvmesh.replica.openai.renderer" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "import kvmesh.cluster.commands.router, kvmesh.cluster.measure.benchmarks.router\n"
        "bad = [m for m in ('torch', 'transformers.models.auto.tokenization_auto') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_router_imports_nothing_from_replica_but_the_serving_core_and_openai_layer():
    offenders = {}
    for path in Path(kvmesh.router.__path__[0]).rglob("*.py"):
        bad = sorted(name for name in _imports(path) if name.startswith("kvmesh.replica")
                     and name != "kvmesh.replica" and not name.startswith(ALLOWED_FROM_REPLICA))
        bad += sorted(n for n in _imports(path) if n == "kvmesh.replica")  # `from kvmesh.replica import x`
        if bad:
            offenders[path.name] = bad
    assert not offenders, f"router/ may import only {ALLOWED_FROM_REPLICA} from replica/: {offenders}"


def test_openai_layer_imports_only_torch_free_replica_modules():
    allowed = ALLOWED_FROM_REPLICA
    for path in [*Path(kvmesh.replica.openai.__path__[0]).rglob("*.py"),
                 *Path(kvmesh.replica.serving.__path__[0]).rglob("*.py")]:
        bad = [n for n in _imports(path) if n.startswith("kvmesh.") and not n.startswith(allowed)]
        assert not bad, f"{path.name} imports {bad}"
