"""The top-level docs stay what they are for: README a front door, ARCHITECTURE a map, BENCHMARKS the current
figures. Their content grows in docs/ (one guide per task), not here; history stays in git."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIMITS = {"README.md": 25_000, "ARCHITECTURE.md": 40_000, "BENCHMARKS.md": 60_000}
"""Bytes: 25, 40 and 60 KB."""


@pytest.mark.parametrize("name", LIMITS)
def test_doc_stays_within_its_size(name):
    size = len((REPO / name).read_bytes())
    assert size <= LIMITS[name], f"{name} is {size} bytes (limit {LIMITS[name]}): move detail to a guide in docs/"
