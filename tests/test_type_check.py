"""The type checker runs where the code is checked, and passes.

``make lint`` runs ``make typecheck``: mypy (pinned in the ``dev`` extras, configured in pyproject.toml's
``[tool.mypy]``) on kvcache/, events/ and router/ at least; CI (``.ci/run``) runs ``make lint``. The static checks
below fail if the checker is dropped from either; the slow ones run it: on the tree (it passes), and on a module
with an import of a name ``collections.abc`` does not have (it is caught, so the configuration is strict enough to
see what it is here to see). A cold run takes about 5 s of CPU, a warm one (its cache in build/typecheck/) 1 s.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("kvcache", "events", "router")
"""The packages the checker must cover (it may cover more)."""


def _target(makefile: str, name: str) -> tuple[str, list[str]]:
    """A Makefile target's prerequisites and recipe lines."""
    found = re.search(rf"^{name}:(.*)\n((?:\t.*\n?)*)", makefile, re.MULTILINE)
    assert found, f"the Makefile has no {name} target"
    return found.group(1), [line.strip() for line in found.group(2).splitlines()]


def _variable(makefile: str, name: str) -> list[str]:
    found = re.search(rf"^{name}\s*\??=\s*(.*)$", makefile, re.MULTILINE)
    assert found, f"the Makefile sets no {name}"
    return found.group(1).split()


def test_make_lint_runs_the_type_checker_on_the_router_packages():
    makefile = (ROOT / "Makefile").read_text()
    lint_needs, lint_recipe = _target(makefile, "lint")
    assert "typecheck" in lint_needs.split() or "$(MAKE) typecheck" in lint_recipe, "make lint does not type-check"
    _, recipe = _target(makefile, "typecheck")
    mypy = [line for line in recipe if re.search(r"(^|/|\s)mypy(\s|$)", line)]
    assert mypy, f"make typecheck runs no mypy: {recipe}"
    assert "$(addprefix -p kvmesh.,$(TYPED))" in " ".join(mypy), f"make typecheck's mypy is not given TYPED: {mypy}"
    assert set(CHECKED) <= set(_variable(makefile, "TYPED"))


def test_ci_runs_make_lint():
    commands = [shlex.split(line) for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert ["make", "lint"] in commands, ".ci/run does not run make lint (the type checker)"


def test_the_checker_is_pinned_in_the_dev_extras_and_configured():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dev = project["project"]["optional-dependencies"]["dev"]
    assert any(re.fullmatch(r"mypy==[\d.]+", spec) for spec in dev), f"mypy is not pinned in dev: {dev}"
    config = project["tool"]["mypy"]
    assert config.get("ignore_errors") is not True and config.get("ignore_missing_imports") is not True
    assert "ignore-without-code" in config.get("enable_error_code", [])


def _typecheck(*make_args: str) -> subprocess.CompletedProcess:
    """``make typecheck`` with this interpreter's mypy (no install step: the suite runs in the installed venv)."""
    return subprocess.run(["make", "--no-print-directory", "typecheck", "STAMP=", f"BIN={Path(sys.executable).parent}",
                           *make_args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_tree_type_checks():
    done = _typecheck()
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_the_checker_sees_a_name_collections_abc_does_not_have(tmp_path):
    """The configuration is strict enough for the bug it was brought in for: a type-only import that names
    nothing."""
    bad = tmp_path / "bad_import.py"
    bad.write_text("from __future__ import annotations\n\nfrom typing import TYPE_CHECKING\n\n"
                   "if TYPE_CHECKING:\n    from collections.abc import ReplicaId\n\n\n"
                   "def first(ids: list[ReplicaId]) -> ReplicaId:\n    return ids[0]\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), str(bad)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Module "collections.abc" has no attribute "ReplicaId"  [attr-defined]' in done.stdout
