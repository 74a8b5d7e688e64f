"""ARCHITECTURE.md and the internals pages it links (docs/internals/) name only rooms and files that exist: every
path they mention (a folder ending in ``/``, or a file with an extension) is a folder or file of the repository,
given whole from the root or as the tail of one (``engine/async_llm.py`` inside the replica's section)."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARCHITECTURE = REPO / "ARCHITECTURE.md"
INTERNALS = sorted((REPO / "docs" / "internals").glob("*.md"))
"""The map's long parts, each a page of its own."""
SKIPPED_DIRS = {".venv", ".git", "build", "dist", "__pycache__"}
PATH = re.compile(r"(?<![\w/.~-])((?:[A-Za-z_][\w.-]*/)*[A-Za-z_][\w-]*\.(?:py|c|h|md|yaml|json)\b|"
                  r"(?:[A-Za-z_][\w.-]*/)+(?![\w.-]))")
"""A file with an extension (after any folders), or a folder path ending in ``/`` (``I/O`` is no path)."""


def _skipped(name: str) -> bool:
    return name in SKIPPED_DIRS or name.endswith(".egg-info")


def repo_paths(root: Path = REPO) -> set[str]:
    """Every file and folder under ``root``, as posix paths relative to it (folders with a trailing ``/``); the
    skipped folders are not walked into (.venv alone holds most of the tree's files)."""
    paths = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not _skipped(d)]
        rel = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        paths.update(prefix + d + "/" for d in dirs)
        paths.update(prefix + f for f in files if not _skipped(f))
    return paths


@functools.cache
def _checkout_paths() -> frozenset[str]:
    """The repository's paths, walked once for every page."""
    return frozenset(repo_paths())


def named_paths(text: str) -> set[str]:
    return {m for m in PATH.findall(text) if "*" not in m}


def missing(text: str, paths: set[str]) -> list[str]:
    """The named paths that are neither a path of the repository nor the tail of one."""
    return sorted(name for name in named_paths(text)
                  if name not in paths and not any(p.endswith("/" + name) for p in paths))


def test_architecture_names_only_existing_rooms_and_files():
    text = ARCHITECTURE.read_text()
    # the map names the code it describes
    assert len(named_paths(text)) >= 5
    assert missing(text, _checkout_paths()) == []


@pytest.mark.parametrize("page", INTERNALS, ids=lambda p: p.name)
def test_internals_pages_name_only_existing_rooms_and_files(page):
    text = page.read_text()
    assert len(named_paths(text)) >= 5  # a page of the map names the code it describes
    assert missing(text, _checkout_paths()) == []


def test_a_room_or_file_that_is_gone_is_reported(tmp_path):
    (tmp_path / "router" / "routing").mkdir(parents=True)
    (tmp_path / "router" / "routing" / "index.py").write_text("")
    text = "`router/routing/` holds `index.py` and `router/routing/trie.py`; `router/gone/` and `gone.py` left."
    assert missing(text, repo_paths(tmp_path)) == ["gone.py", "router/gone/", "router/routing/trie.py"]
