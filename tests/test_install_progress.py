"""``make install`` (and so the first ``make serve``) says what it is doing: a line before each step, and pip's own
progress, not ``--quiet``, for the two large downloads (torch; kvmesh with Ray and transformers). Run here with a
stand-in python that records what pip is asked, so nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STUB = """#!/bin/sh
# A python that only says what it was asked: `-m venv DIR` makes DIR/bin/python (this script), pip records its args.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then shift 2; echo "PIP $*"; fi
exit 0
"""


@pytest.fixture()
def install_output(tmp_path) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    venv = tmp_path / "venv"
    run = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "install", f"VENV={venv}",
                          f"PYTHON={stub}"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (venv / ".kvmesh-installed").exists()
    return run.stdout.splitlines()


def test_each_install_step_is_announced_before_it_runs(install_output):
    steps = [i for i, line in enumerate(install_output) if line.startswith("install ") and "/4: " in line]
    pips = [i for i, line in enumerate(install_output) if line.startswith("PIP ")]
    assert len(steps) == 4 and len(pips) == 3
    assert steps[0] < steps[1] < pips[0] < steps[2] < pips[1] < steps[3] < pips[2], install_output
    assert install_output[-1].startswith("install: done in ") and install_output[-1].endswith("/bin/kvmesh")


def test_the_large_downloads_show_pips_progress(install_output):
    torch, project = [line for line in install_output
                      if line.startswith("PIP install") and "pip setuptools" not in line]
    assert "torch" in torch and "-e" in project
    assert "--quiet" not in torch and "-q" not in torch.split() and "--quiet" not in project


def test_no_recipe_line_is_echoed_raw(install_output):
    assert not [line for line in install_output if line.lstrip().startswith(("test -x", "touch "))]
