"""The architecture folders install under the ``kvmesh.`` namespace, editable and as a wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
    )
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
