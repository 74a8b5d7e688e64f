"""Every table of figures in BENCHMARKS.md and docs/benchmarks/ is either generated from its results file
(between ``<!-- table: KIND results/FILE -->`` and ``<!-- /table -->``: tests/test_doc_tables.py holds it to the
file) or says, in the paragraph right above it, that it was written by hand, from what, and when its run was made:

    *Written by hand from `results/kvcache.json`; run of 2026-11-21.*

The date is the run's (the day its results file was committed), a real day, not in the future; every results file
the note names exists. A table of figures is a Markdown table with a digit in a row below its header."""

from __future__ import annotations

import datetime
import glob
import re
from pathlib import Path

import pytest

from .test_results_named import expand

REPO = Path(__file__).resolve().parent.parent
NOTE = re.compile(r"^\*Written by hand from (?P<source>.+); run of (?P<date>\d{4}-\d{2}-\d{2})\.\*$", re.S)
RESULTS = re.compile(r"`(results/[^`\s]+)`")
GENERATED_OPEN, GENERATED_CLOSE = re.compile(r"^\s*<!-- table: \w+ \S+ -->"), re.compile(r"^\s*<!-- /table -->")
DIVIDER = re.compile(r"^\s*\|\s*:?-{3}")


def benchmark_docs(root: Path = REPO) -> list[Path]:
    return [root / "BENCHMARKS.md", *sorted((root / "docs" / "benchmarks").glob("*.md"))]


def figure_tables(text: str) -> list[tuple[int, bool, str]]:
    """Each table of figures: (its line number, whether it is generated, the paragraph right above it)."""
    lines, found, generated, fence = text.splitlines(), [], False, False
    i = 0
    while i < len(lines):
        line = lines[i]
        fence ^= line.lstrip().startswith(("```", "~~~"))
        generated = (generated or bool(GENERATED_OPEN.match(line))) and not GENERATED_CLOSE.match(line)
        if fence or not line.lstrip().startswith("|") or i + 1 >= len(lines) or not DIVIDER.match(lines[i + 1]):
            i += 1
            continue
        end = i + 2
        while end < len(lines) and lines[end].lstrip().startswith("|"):
            end += 1
        if any(re.search(r"\d", row) for row in lines[i + 2:end]):
            above, k = [], i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            while k >= 0 and lines[k].strip() and not lines[k].lstrip().startswith(("|", "#", "<!--", "```")):
                above.insert(0, lines[k].strip())
                k -= 1
            found.append((i + 1, generated, " ".join(above)))
        i = end
    return found


def note_problem(paragraph: str, root: Path = REPO, today: datetime.date | None = None) -> str | None:
    """What is wrong with a hand-written table's note (None: nothing)."""
    note = NOTE.match(paragraph)
    if note is None:
        return "neither generated nor a dated note right above it ('*Written by hand from ...; run of YYYY-MM-DD.*')"
    try:
        day = datetime.date.fromisoformat(note.group("date"))
    except ValueError:
        return f"its date {note.group('date')} is no day"
    if day > (today or datetime.date.today()):
        return f"its date {day} is in the future"
    missing = [name for name in RESULTS.findall(note.group("source"))
               if not any(glob.glob(str(root / pattern)) for pattern in expand(name))]
    return f"it names results files that do not exist: {', '.join(missing)}" if missing else None


def undated_tables(path: Path, root: Path = REPO) -> list[str]:
    problems = []
    for line, generated, above in figure_tables(path.read_text()):
        problem = None if generated else note_problem(above, root)
        if problem:
            problems.append(f"{path.relative_to(root)}:{line}: {problem}")
    return problems


def test_there_are_tables_of_both_kinds():
    tables = [t for doc in benchmark_docs() for t in figure_tables(doc.read_text())]
    assert sum(generated for _, generated, _ in tables) >= 9
    assert sum(not generated for _, generated, _ in tables) >= 20
    assert len(benchmark_docs()) > 1


@pytest.mark.parametrize("doc", benchmark_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_table_of_figures_is_generated_or_dated(doc):
    assert undated_tables(doc) == []


def test_an_undated_a_misdated_and_a_generated_table(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text("{}")
    table = "| x | y |\n|---|---|\n| a | 1.5 |\n"
    doc = tmp_path / "B.md"
    doc.write_text("# B\n\nProse.\n\n" + table + "\n*Written by hand from `results/a.json`; run of\n2026-11-21.*\n\n"
                   + table + "\n*Written by hand from `results/gone.json`; run of 2026-11-21.*\n\n" + table
                   + "\n*Written by hand from `results/a.json`; run of 2026-02-30.*\n\n" + table
                   + "\n<!-- table: sim results/a.json -->\n" + table + "<!-- /table -->\n"
                   + "\n| words | only |\n|---|---|\n| a | b |\n")
    assert [line for line, _, _ in figure_tables(doc.read_text())] == [5, 12, 18, 24, 29]
    assert undated_tables(doc, tmp_path) == [
        "B.md:5: neither generated nor a dated note right above it ('*Written by hand from ...; run of YYYY-MM-DD.*')",
        "B.md:18: it names results files that do not exist: results/gone.json",
        "B.md:24: its date 2026-02-30 is no day",
    ]
    assert note_problem("*Written by hand from `results/a.json`; run of 2999-01-01.*", tmp_path,
                        datetime.date(2026, 11, 26)) == "its date 2999-01-01 is in the future"
