"""``router/__init__.py`` describes the router's rooms: the folders its docstring lists (``routing/``, ...) are
exactly the router's sub-packages, and the count it gives ("in five rooms") is theirs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROUTER = Path(__file__).resolve().parent.parent / "router"
LISTED = re.compile(r"^    (\w+)/ ", re.M)
COUNT = re.compile(r"\bin (\w+) rooms\b")
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def sub_packages(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def room_problems(docstring: str, folder: Path) -> list[str]:
    """What the docstring gets wrong about ``folder``'s rooms: a listed room that is none, a room not listed,
    a count that is not theirs."""
    listed, actual = set(LISTED.findall(docstring)), sub_packages(folder)
    problems = [f"{name}/ is listed but is no sub-package" for name in sorted(listed - actual)]
    problems += [f"{name}/ is a sub-package the docstring does not list" for name in sorted(actual - listed)]
    count = COUNT.search(docstring)
    if count is None or WORDS.get(count.group(1)) != len(actual):
        problems.append(f"the docstring should say 'in {len(actual)} rooms' (as a word), not "
                        f"{count.group(0) if count else 'nothing'!r}")
    return problems


def test_the_router_docstring_lists_its_rooms():
    docstring = ast.get_docstring(ast.parse((ROUTER / "__init__.py").read_text()))
    assert docstring
    assert room_problems(docstring, ROUTER) == []


def test_a_missing_or_invented_room_is_reported(tmp_path):
    for room in ("a", "b"):
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text("")
    (tmp_path / "_native").mkdir()  # C sources: no room
    doc = "The pkg, in three rooms.\n\n    a/   one\n    gone/   two\n"
    assert room_problems(doc, tmp_path) == ["gone/ is listed but is no sub-package",
                                            "b/ is a sub-package the docstring does not list",
                                            "the docstring should say 'in 2 rooms' (as a word), not 'in three rooms'"]
