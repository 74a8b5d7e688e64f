"""Wherever a guide or a docstring says which routing policy is the default, it names the real one: the
registry's ``DEFAULT_POLICY``, which ``RouterConfig.policy`` and ``KVRouter`` (given no policy) take.

A claim is a registered policy name, quoted (```name```, ````name````, ``**name**``), next to the word
"default": ``name`` (the default), the default ``name``, ``name`` by default, None = ``name``. The README's
tour, which walks one request through the router, names the default policy as such."""

from __future__ import annotations

import re
from pathlib import Path

from kvmesh.router.config import RouterConfig
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import DEFAULT_POLICY, POLICIES

REPO = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".venv", ".git", "build", "dist", "__pycache__", "node_modules"}
DOC_ROOTS = ("README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "docs")
CODE_ROOTS = ("router", "cluster", "replica", "kvcache", "events")


def _claims_pattern(names: list[str]) -> re.Pattern[str]:
    name = r"(?:`{1,2}|\*\*)(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?:`{1,2}|\*\*)"
    return re.compile(  # `x` (the default); `x` by default; the default, `x` (not "by default, `y`"); None = `x`
        name + r",?\s\(?(?:is\s|as\s)?(?:the\s)?default\b(?!\s\w+\sof)"
        + r"|" + name + r"\sby\sdefault"
        + r"|(?<!by\s)\bdefault(?:\spolicy)?(?:\sis|:|,|\s=)?\s(?:the\s)?" + name
        + r"|\bNone\s*[=:]\s*" + name)


def default_claims(text: str, names: list[str] | None = None) -> list[tuple[int, str]]:
    """Each claim in ``text`` of which policy is the default: (line number, the policy it names)."""
    found = []
    for m in _claims_pattern(names or list(POLICIES)).finditer(text):
        named = next(g for g in m.groups() if g)
        found.append((text.count("\n", 0, m.start()) + 1, named))
    return found


def _files() -> list[Path]:
    paths = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "BENCHMARKS.md"]
    paths += sorted((REPO / "docs").rglob("*.md"))
    for root in CODE_ROOTS:
        paths += sorted(p for p in (REPO / root).rglob("*.py")
                        if not any(part in SKIPPED_DIRS for part in p.relative_to(REPO).parts))
    return paths


def wrong_claims() -> tuple[int, list[str]]:
    """How many claims the docs and the code's docstrings make, and those that name another policy."""
    count, wrong = 0, []
    for path in _files():
        for line, named in default_claims(path.read_text()):
            count += 1
            if named != DEFAULT_POLICY:
                wrong.append(f"{path.relative_to(REPO)}:{line} names `{named}` as the default ({DEFAULT_POLICY} is)")
    return count, wrong


def test_the_default_is_one_policy_everywhere_in_the_code():
    assert DEFAULT_POLICY in POLICIES
    assert RouterConfig().policy == DEFAULT_POLICY
    assert KVRouter().policy_name == DEFAULT_POLICY


def test_every_doc_and_docstring_that_names_the_default_names_the_real_one():
    count, wrong = wrong_claims()
    assert count >= 8  # the README, ARCHITECTURE, the guides and RouterConfig all say which one it is
    assert wrong == []


def test_the_readme_tour_names_the_default_policy():
    readme = (REPO / "README.md").read_text()
    tour = readme.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    request = tour.split("**A request.**", 1)[1].split("\n\n", 1)[0]
    assert [named for _, named in default_claims(request)] == [DEFAULT_POLICY]


def test_a_wrong_or_stale_claim_is_found():
    names = ["cache_aware", "cache_aware_tokens", "round_robin"]
    text = ("``policy``: None = ``cache_aware`` with its defaults\n"
            "the default, `cache_aware_tokens`, prices tokens\n"
            "| **round_robin** (the default) | 4.1% |\n"
            "`cache_aware` by default; `round_robin` at their CLI defaults\n"
            "(default: cache_aware,round_robin)\n"
            "a policy (`cache_aware_tokens`\nby default, `cache_aware`, `round_robin`)\n")
    assert default_claims(text, names) == [(1, "cache_aware"), (2, "cache_aware_tokens"), (3, "round_robin"),
                                           (4, "cache_aware"), (6, "cache_aware_tokens")]
