"""The architecture folders install under the ``kvmesh.`` namespace, editable and as a wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds and installs the package

REPO_ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("kvcache", "events", "replica", "router", "cluster")


def test_editable_install_maps_folders_to_kvmesh_namespace():
    import importlib

    for layer in LAYERS:
        module = importlib.import_module(f"kvmesh.{layer}")
        assert Path(module.__file__).resolve().parent == REPO_ROOT / layer


@pytest.mark.slow
def test_wheel_contains_only_namespaced_packages(tmp_path):
    # Build from a copy so the checkout gets no build/ directory.
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.so")  # the wheel compiles its own
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in"):
        shutil.copy(REPO_ROOT / name, source / name)
    for layer in LAYERS:
        shutil.copytree(REPO_ROOT / layer, source / layer, ignore=ignore)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    # the build is quiet: no deprecated license table, no package setuptools would have to guess at
    assert "Warning" not in build.stdout + build.stderr, build.stdout + build.stderr
    (wheel,) = tmp_path.glob("kvmesh-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.startswith("kvmesh-")}
    assert top_level == {"kvmesh"}, f"wheel installs generic top-level names: {top_level - {'kvmesh'}}"
    for layer in LAYERS:
        assert f"kvmesh/{layer}/__init__.py" in names
    assert "kvmesh/events/schema.py" in names
    assert not any(name.startswith("kvmesh/tests/") for name in names)
    # the router's C hot path is compiled by the build itself (gcc + Python headers)
    assert any(name.startswith("kvmesh/router/_fastpath.") and name.endswith(".so") for name in names)


def test_console_script_prints_help():
    out = subprocess.run(
        [sys.executable, "-m", "kvmesh.cluster.cli", "--help"], check=True, capture_output=True, text=True
    )
    assert "kvmesh" in out.stdout


# Distributions kvmesh never imports by name but needs: (name -> why). None today: uvloop and
# httptools, once only uvicorn's, are imported by the router's own HTTP server (router/http/).
USED_INDIRECTLY: dict[str, str] = {}
IMPORT_NAMES = {"pyzmq": "zmq", "pyyaml": "yaml", "prometheus-client": "prometheus_client", "flash-attn": "flash_attn",
                "psycopg-pool": "psycopg_pool"}


def _requirement_name(req: str) -> str:
    import re

    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def _declared() -> tuple[set[str], set[str]]:
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    core = {_requirement_name(r) for r in project["dependencies"]}
    extras = {_requirement_name(r) for name, reqs in project["optional-dependencies"].items() if name != "dev"
              for r in reqs} - {"kvmesh"}
    return core, extras


def _imported(folders=LAYERS, top_level_only: bool = False) -> set[str]:
    import ast

    found = set()
    for layer in folders:
        for path in (REPO_ROOT / layer).rglob("*.py"):
            tree = ast.parse(path.read_text())
            nodes = tree.body if top_level_only else ast.walk(tree)
            for node in nodes:
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"kvmesh", "__future__"}


def test_every_imported_package_is_declared_and_every_declared_one_is_used():
    core, extras = _declared()
    declared = {IMPORT_NAMES.get(name, name) for name in core | extras}
    imported = _imported()
    assert imported <= declared, f"imported but not declared: {imported - declared}"
    unused = declared - imported - set(USED_INDIRECTLY)
    assert not unused, f"declared but never imported: {unused}"


def test_torch_free_layers_import_only_core_dependencies_at_module_level():
    core, _ = _declared()
    core_modules = {IMPORT_NAMES.get(name, name) for name in core}
    imported = _imported(("kvcache", "events", "router"), top_level_only=True)
    assert imported <= core_modules, f"router/events/kvcache need extras at import: {imported - core_modules}"


def test_nixl_comes_with_the_engine_extra_only():
    # the KV transfer library (replica/kv_transfer/) requires torch: never in the core (router) install
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "nixl" in {_requirement_name(r) for r in project["optional-dependencies"]["engine"]}
    assert "nixl" not in {_requirement_name(r) for r in project["dependencies"]}
