"""The top-level docs stay what they are for: README a front door, ARCHITECTURE a map, BENCHMARKS the current
figures. Their content grows in docs/ (one guide per task), not here; history stays in git.

Each has a budget in bytes, reported, not a limit that edits prose: a doc past its budget gets a warning naming
its size (move a long part to its own page: docs/internals/, docs/benchmarks/, a guide), and only a doc past
``CEILING`` times its budget fails. An explanation is never cut to fit.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUDGETS = {"README.md": 25_000, "ARCHITECTURE.md": 40_000, "BENCHMARKS.md": 60_000}
"""Bytes each doc is planned to fit: 25, 40 and 60 KB."""
CEILING = 1.5
"""A doc this many times over its budget has stopped being what it is for: the test fails."""


def size_report() -> str:
    """One line per doc: its size against its budget."""
    return "\n".join(f"{name}: {len((REPO / name).read_bytes()):,} of {budget:,} bytes"
                     for name, budget in BUDGETS.items())


@pytest.mark.parametrize("name", BUDGETS)
def test_doc_is_reported_against_its_budget(name):
    size, budget = len((REPO / name).read_bytes()), BUDGETS[name]
    if size > budget:
        warnings.warn(f"{name} is {size:,} bytes, over its budget of {budget:,}: move a long part to its own page "
                      "(docs/internals/, docs/benchmarks/ or a guide), never cut an explanation\n" + size_report(),
                      stacklevel=1)
    assert size <= CEILING * budget, (f"{name} is {size:,} bytes, {size / budget:.1f}x its budget of {budget:,}: "
                                      "it is no longer a front door / map / table of current figures; move its long "
                                      "parts to docs/")


def test_the_report_names_every_doc_and_its_budget():
    report = size_report()
    assert all(f"{name}: " in report and f"of {budget:,} bytes" in report for name, budget in BUDGETS.items())
