"""ARCHITECTURE.md's layout table lists each package's rooms, all of them: the folders named in a package's row
(```engine/``, ``worker/graphs/``, ``measure/loadgen/``) are exactly its sub-packages, and a room whose own rooms
the row names has them all named too. test_architecture_names.py checks that what the doc names exists; this
one checks that what exists is named."""

from __future__ import annotations

import re
from pathlib import Path

from .test_architecture_names import ARCHITECTURE, REPO

ROW = re.compile(r"^\| `([\w/]+)/` \| (.*?) \| [^|]* \|$", re.M)
FOLDER = re.compile(r"`([\w/]+)/`")


def layout_rows(text: str) -> dict[str, str]:
    """The layout table's rows: package folder (``replica``, ``replica/serving``) -> what its row says."""
    return {m.group(1): m.group(2) for m in ROW.finditer(text)}


def rooms(folder: Path) -> set[str]:
    """The sub-packages of ``folder`` (folders with an ``__init__.py``), by name."""
    return {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def unnamed_and_unknown(text: str, root: Path = REPO) -> list[str]:
    """Rooms that exist under a row's package but are not named there, and named ones that are no room. A row
    lists its package's rooms; where it names a room's own rooms (``worker/graphs/``), it lists those whole."""
    rows = layout_rows(text)
    problems = []
    for package, cell in rows.items():
        named = {name.strip("/").removeprefix(package + "/") for name in FOLDER.findall(cell)}
        named |= {n.rpartition("/")[0] for n in named if "/" in n}  # a room's parents are rooms too
        children: dict[str, set[str]] = {"": set()}  # the package's own rooms are always listed
        for name in named:
            parent, _, room = name.rpartition("/")
            children.setdefault(parent, set()).add(room)
        for parent, listed in sorted(children.items()):
            where = f"{package}/{parent}/" if parent else f"{package}/"
            folder = root / where
            actual = rooms(folder) if folder.is_dir() else set()
            own_rows = {r.rpartition("/")[2] for r in rows if r.rpartition("/")[0] == where.rstrip("/")}
            problems += [f"{where}{r}/ is named in the row for {package}/ but is no room"
                         for r in sorted(listed - actual)]
            problems += [f"{where}{r}/ is a room the row for {package}/ does not name"
                         for r in sorted(actual - listed - own_rows)]
    return problems


def test_the_layout_table_names_every_room_and_only_rooms():
    text = ARCHITECTURE.read_text()
    assert {"kvcache", "events", "replica", "router", "cluster"} <= set(layout_rows(text))
    assert unnamed_and_unknown(text) == []


def test_a_room_the_table_leaves_out_or_invents_is_reported(tmp_path):
    for room in ("a", "b", "b/x", "b/y"):
        (tmp_path / "pkg" / room).mkdir(parents=True)
        (tmp_path / "pkg" / room / "__init__.py").write_text("")
    (tmp_path / "pkg" / "native").mkdir()  # C sources: no room
    text = ("| folder | what | may import |\n|---|---|---|\n"
            "| `pkg/` | `a/`, `b/x/` and `gone/` | all |\n")
    assert unnamed_and_unknown(text, tmp_path) == [
        "pkg/gone/ is named in the row for pkg/ but is no room",
        "pkg/b/y/ is a room the row for pkg/ does not name",
    ]
