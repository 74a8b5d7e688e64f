"""Every module of the torch-free packages imports first, in a fresh interpreter: a module-level circle that
runs through a package's ``__init__`` (``a.x`` imports ``b``, whose import runs ``a/__init__``, which imports
``a.x`` back before it is done) fails only when one of its modules is imported before the others, which a
static graph of the files does not show (test_import_graph.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGES = ("kvmesh.kvcache", "kvmesh.events", "kvmesh.router")

IMPORT_EACH = textwrap.dedent("""
    import importlib, pkgutil, sys
    prefixes = sys.argv[1:]
    names = []
    for package in prefixes:
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")]
    for name in names:
        for loaded in [k for k in sys.modules if any(k == p or k.startswith(p.split(".")[0] + ".") for p in prefixes)]:
            del sys.modules[loaded]
        try:
            importlib.import_module(name)
        except Exception as e:
            print(f"{name}: {type(e).__name__}: {e}")
""")


def first_import_failures(packages: tuple[str, ...], path: Path | None = None) -> list[str]:
    """Each module of ``packages`` imported first (every module of their top package unloaded before it);
    the ones that fail, with why."""
    env_path = [str(path)] if path else []
    result = subprocess.run([sys.executable, "-c", f"import sys; sys.path[:0] = {env_path!r}\n" + IMPORT_EACH,
                             *packages], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_every_torch_free_module_imports_first():
    assert first_import_failures(PACKAGES) == []


def test_a_circle_through_a_package_init_is_reported(tmp_path):
    (tmp_path / "circ" / "cost").mkdir(parents=True)
    (tmp_path / "circ" / "__init__.py").write_text("")
    (tmp_path / "circ" / "columns.py").write_text("from circ.cost.fleet import Fleet\nclass Columns: ...\n")
    (tmp_path / "circ" / "cost" / "__init__.py").write_text("from circ.cost.price import price\n")
    (tmp_path / "circ" / "cost" / "fleet.py").write_text("class Fleet: ...\n")
    (tmp_path / "circ" / "cost" / "price.py").write_text("from circ.columns import Columns\ndef price(): ...\n")
    failures = first_import_failures(("circ",), tmp_path)
    assert [f.split(":")[0] for f in failures] == ["circ.columns"]
    assert "partially initialized" in failures[0]
