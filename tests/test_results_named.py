"""``results/`` holds only what the docs name: every file there is named by README, ARCHITECTURE, BENCHMARKS, a
guide or page in docs/ (docs/benchmarks/ too) or deploy/README (or a results note the docs name), as
``results/NAME.ext``, as another file of the same stem (``results/flood.json, .png``), or by a pattern
(``results/sim_pd_*_kv_transfer.png``, ``results/flood_endless_{1,2,3}.json``). A file no doc names is a figure no
reader can find."""

from __future__ import annotations

import fnmatch
import itertools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
NAMED = re.compile(r"results/([\w.*{},/-]+)")


def docs(root: Path = REPO) -> list[Path]:
    return [root / "README.md", root / "ARCHITECTURE.md", root / "BENCHMARKS.md", root / "deploy" / "README.md",
            *sorted((root / "docs").rglob("*.md")), *sorted((root / "results").glob("*.md"))]


def expand(pattern: str) -> list[str]:
    """``a_{1,2}.json`` -> ``a_1.json``, ``a_2.json`` (any number of brace groups)."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def named_patterns(texts: list[str]) -> set[str]:
    return {name.rstrip(".,") for text in texts for found in NAMED.findall(text) for name in expand(found)}


def unnamed(files: list[str], patterns: set[str]) -> list[str]:
    stems = {p.split(".")[0] for p in patterns if "*" not in p}
    globs = {p for p in patterns if "*" in p}
    return sorted(f for f in files if f not in patterns and f.split(".")[0] not in stems
                  and not any(fnmatch.fnmatchcase(f, g) for g in globs))


def results_files(root: Path = RESULTS) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_every_result_is_named_by_the_docs():
    texts = [p.read_text() for p in docs() if p.exists()]
    assert unnamed(results_files(), named_patterns(texts)) == []


def test_a_file_no_doc_names_is_reported():
    texts = ["`results/flood.json`, `.png`; `results/sim_pd_*_kv_transfer.png`; results/endless_{1,2}.json."]
    files = ["flood.json", "flood.png", "sim_pd_a_kv_transfer.png", "endless_1.json", "endless_2.json",
             "endless_3.json", "sim_pd_a.json", "old_before.json"]
    assert unnamed(files, named_patterns(texts)) == ["endless_3.json", "old_before.json", "sim_pd_a.json"]
