"""Every relative link in the repository's Markdown resolves: the file it names exists, and a ``#fragment``
names a heading of that file (GitHub's anchor of it). Links inside code blocks and to other sites are not
checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".venv", "build", "dist", "node_modules"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def markdown_files() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.md")
                  if not any(part in SKIPPED_DIRS or part.startswith(".") or part.endswith(".egg-info")
                             for part in p.relative_to(REPO).parts[:-1]))


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of ``path``: lower case, punctuation dropped, spaces as hyphens."""
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return broken


def test_there_are_docs_to_check():
    names = {str(p.relative_to(REPO)) for p in markdown_files()}
    assert {"README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "docs/laptop.md"} <= names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path):
    (tmp_path / "guide.md").write_text("# A guide\n\n## `kvmesh serve`: two words\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](guide.md#kvmesh-serve-two-words) [gone](missing.md) [no anchor](guide.md#three-words) "
                    "[web](https://example.com/x.md) ![img](missing.png)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "guide.md#three-words: no heading #three-words in guide.md",
                                  "missing.png: no such file"]
