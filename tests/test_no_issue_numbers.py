"""What users read never names the development process: no "issue N" or "#N"-style issue reference in the
docs, the source (its comments, docstrings, help texts and CLI output), the tests or the configs. A comment
may keep the reason for a choice, without the number; history lives in git."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
THIS_FILE = Path(__file__).resolve()
"""Its examples are what the check looks for."""
SKIPPED_DIRS = {".venv", ".git", "build", "dist", "__pycache__", "node_modules"}
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".json", ".c", ".h", ".cfg", ".ini", ".txt", ".in"}
ISSUE = re.compile(r"\bissues?[ s]*#?\d+|(?<![\w#&/'\"-])#\d{1,4}\b(?![0-9a-fA-F])", re.I)
"""The word issue followed by a number (``#38`` too, and several: ``21/22``), or ``(#38)``; not a colour
(``#ffffff``) or an HTML entity."""


def checked_files() -> list[Path]:
    return sorted(p for p in REPO.rglob("*")
                  if p.is_file() and (p.suffix in SUFFIXES or p.name == "Makefile") and p != THIS_FILE
                  and not any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in p.relative_to(REPO).parts))


def references(text: str) -> list[str]:
    found = []
    for match in ISSUE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(f"{line}: {match.group(0)}")
    return found


def test_the_check_covers_docs_source_and_tests():
    names = {str(p.relative_to(REPO)) for p in checked_files()}
    assert {"README.md", "BENCHMARKS.md", "router/config.py", "cluster/cli.py", "tests/conftest.py"} <= names


@pytest.mark.parametrize("path", checked_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_issue_reference(path):
    assert references(path.read_text(errors="replace")) == []


WORD, WORDS = "issue", "issues"  # joined below, so this file shows no reference itself


@pytest.mark.parametrize("text", [f"fixed in {WORD} 12", f"{WORD.title()} #38's acceptance", f"{WORDS} 21/22",
                                  "see (#38)", f"# {WORD.title()} 16: a cluster that grows"])
def test_an_issue_reference_is_found(text):
    assert references(text)


@pytest.mark.parametrize("text",
                         [f"t{WORD} 5", "an issue with 5 replicas", "color: #ffffff", "&#39;", "## 1,000 replicas",
                                  "x[#]", "issues are few"])
def test_what_is_no_issue_reference_passes(text):
    assert references(text) == []
