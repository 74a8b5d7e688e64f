"""The maintainer's docs read as prose: no line of prose in ARCHITECTURE.md, BENCHMARKS.md, README.md, the
overload guide or the internals and benchmark pages (docs/internals/, docs/benchmarks/) is longer than ``WIDTH``
characters. Tables, code blocks and generated blocks are exempt (a table row is one line; a picture is as wide as it
is drawn; ``kvmesh bench report`` writes what lies between ``<!-- table: ... -->`` and ``<!-- /table -->``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WIDTH = 120
"""The longest line of prose, in characters."""
FENCE = re.compile(r"^\s*(```|~~~)")
GENERATED = re.compile(r"^\s*<!-- table: .*?^\s*<!-- /table -->", re.S | re.M)


def checked_docs(root: Path = REPO) -> list[Path]:
    """The docs held to ``WIDTH``: the top-level three, the overload guide and the pages split off them."""
    docs = [root / "ARCHITECTURE.md", root / "BENCHMARKS.md", root / "README.md", root / "docs" / "overload.md"]
    return (docs + sorted((root / "docs" / "internals").glob("*.md"))
            + sorted((root / "docs" / "benchmarks").glob("*.md")))


def long_prose_lines(text: str, width: int = WIDTH) -> list[str]:
    """``line N: M characters`` for each line of prose (not in a code block, a table row or a generated block) over
    ``width``."""
    text = GENERATED.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # blank, keeping the line numbers
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is not None:
            fence = None if opened and opened.group(1) == fence else fence
            continue
        if opened:
            fence = opened.group(1)
            continue
        if line.lstrip().startswith("|"):
            continue
        if len(line) > width:
            found.append(f"line {number}: {len(line)} characters")
    return found


def test_the_docs_to_check_are_there():
    names = {str(p.relative_to(REPO)) for p in checked_docs()}
    assert {"ARCHITECTURE.md", "BENCHMARKS.md", "README.md", "docs/overload.md"} <= names
    assert any(name.startswith("docs/internals/") for name in names)


@pytest.mark.parametrize("doc", checked_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_line_of_prose_is_over_the_width(doc):
    assert long_prose_lines(doc.read_text()) == [], f"{doc.relative_to(REPO)}: rewrap these lines to {WIDTH}"


def test_a_long_line_of_prose_is_found_and_tables_and_code_are_not():
    long = "word " * 30
    text = "\n".join(["# A doc", "short prose", long, "| " + long + " |", "  | " + long + " |", "```", long,
                      "```", "~~~text", long, "~~~", "  - " + long, "<!-- table: sim results/x.json -->", long,
                      "<!-- /table -->"])
    assert long_prose_lines(text) == ["line 3: 150 characters", "line 12: 154 characters"]
