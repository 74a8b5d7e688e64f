"""The import graph of the installed package: every import points down, no circle.

Every kvmesh import a module's text names is an edge (module level, inside functions, under ``TYPE_CHECKING``,
relative ones resolved), read from the files of the installed ``kvmesh`` package. ARCHITECTURE.md, "Layout and
layering", draws it:

- the top-level packages in one order, each importing only those below it::

      cluster -> router -> replica -> kvcache -> events

- inside every package, at every depth, its rooms (its sub-packages, its modules and its ``__init__``) import each
  other one way only: no circle among them, so no circle among modules either. A circle through sub-packages can
  hide from a module-level check (``a/x -> b/y`` and ``b/z -> a/w`` are no circle of modules, but ``a`` and ``b``
  reach each other); this check sees it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("events", "kvcache", "replica", "router", "cluster")
"""The top-level packages from the bottom up: each imports only those before it."""
TOPS = LAYERS


def installed_root() -> Path:
    """The folder the installed ``kvmesh.<top>`` packages live in (setup.py maps the repository's top folders)."""
    roots = {Path(importlib.util.find_spec(f"kvmesh.{top}").origin).parent.parent for top in TOPS}
    assert len(roots) == 1, f"kvmesh's packages are installed from several places: {roots}"
    return roots.pop()


def kvmesh_modules(root: Path) -> dict[str, Path]:
    """Every kvmesh module under ``root`` (its dotted name -> its file); a package is its ``__init__.py``."""
    mods = {}
    for top in TOPS:
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods["kvmesh." + ".".join(parts)] = path
    return mods


def _named(module: str, path: Path, node: ast.AST) -> list[str]:
    """The dotted names an import statement names (``from a import b``: ``a.b``, which may be a module; relative
    ones resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - (node.level - 1)] + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path | None = None) -> dict[str, set[str]]:
    """kvmesh module -> the kvmesh modules it imports anywhere in its text."""
    return _graph(installed_root() if root is None else root)


@functools.cache
def _graph(root: Path) -> dict[str, set[str]]:
    mods = kvmesh_modules(root)

    def owner(name: str) -> str | None:  # `from kvmesh.a.b import C` -> kvmesh.a.b (or kvmesh.a.b.C, a module)
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for name in _named(module, path, node):
                target = owner(name) if name.startswith("kvmesh.") else None
                if target and target != module:
                    graph[module].add(target)
    return graph


def _parts(module: str, mods_is_package: bool) -> list[str]:
    """A module's place in the tree: ``kvmesh.a.b`` -> [a, b]; a package's ``__init__`` is a room of its own."""
    parts = module.split(".")[1:]
    return [*parts, "__init__"] if mods_is_package else parts


def room_graphs(graph: dict[str, set[str]], packages: set[str]) -> dict[str, dict[str, set[str]]]:
    """Package (dotted, "" for kvmesh itself) -> its rooms -> the rooms of it they import: an import from
    ``p.a...`` to ``p.b...`` (``a != b``) is a door from room ``a`` to room ``b`` of package ``p``."""
    rooms: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for module, targets in graph.items():
        here = _parts(module, module in packages)
        for target in targets:
            there = _parts(target, target in packages)
            depth = 0
            while here[depth] == there[depth]:
                depth += 1
            package = ".".join(here[:depth])
            rooms[package][here[depth]].add(there[depth])
            rooms[package].setdefault(there[depth], set())
    return rooms


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return sorted(found)


def circles_in_rooms(root: Path | None = None) -> dict[str, list[list[str]]]:
    """Package -> the circles among its rooms (none anywhere when every import points down)."""
    root = installed_root() if root is None else root
    mods = kvmesh_modules(root)
    packages = {m for m, path in mods.items() if path.name == "__init__.py"}
    found = {package: circles(rooms) for package, rooms in room_graphs(import_graph(root), packages).items()}
    return {package: groups for package, groups in found.items() if groups}


def upward_imports(root: Path | None = None) -> list[str]:
    """Imports from a top-level package to one above it in ``LAYERS``."""
    return sorted(f"{module} -> {target}" for module, targets in import_graph(root).items() for target in targets
                  if LAYERS.index(target.split(".")[1]) > LAYERS.index(module.split(".")[1]))


def test_the_graph_is_read_from_the_installed_package():
    assert installed_root() == ROOT, "the tests should run against this checkout's installed kvmesh"


def test_no_module_imports_a_package_above_its_own():
    assert upward_imports() == []


def test_no_circle_among_the_rooms_of_any_package():
    assert circles_in_rooms() == {}


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_check_sees_a_circle_through_a_type_checking_import(tmp_path):
    """The check itself can fail: two modules naming each other's types, one only for the type checker."""
    root = _write(tmp_path, {
        "router/a.py": "from kvmesh.router.b import B\nclass A: ...\n",
        "router/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvmesh.router.a import A\n",
        "router/c.py": "def f():\n    from kvmesh.router.a import A\n"})
    assert circles_in_rooms(root) == {"router": [["a", "b"]]}


def test_the_check_sees_two_rooms_reaching_each_other_through_different_modules(tmp_path):
    """No module circle (x -> y, z -> w), but the rooms ``a`` and ``b`` of ``replica`` reach each other; relative
    imports count."""
    root = _write(tmp_path, {
        "replica/a/x.py": "from kvmesh.replica.b.y import Y\n", "replica/b/y.py": "class Y: ...\n",
        "replica/b/z.py": "from ..a import w\n", "replica/a/w.py": "class W: ...\n"})
    assert circles(import_graph(root)) == []
    assert circles_in_rooms(root) == {"replica": [["a", "b"]]}


def test_the_check_sees_a_package_init_its_own_module_imports_back(tmp_path):
    """A registry ``__init__`` importing a module that imports the registry: a circle inside the package."""
    root = _write(tmp_path, {
        "kvcache/eviction/__init__.py": "from kvmesh.kvcache.eviction.lru import LRU\nREGISTRY = {}\n",
        "kvcache/eviction/lru.py": "from kvmesh.kvcache.eviction import REGISTRY\nclass LRU: ...\n"})
    assert circles_in_rooms(root) == {"kvcache.eviction": [["__init__", "lru"]]}


def test_the_check_sees_an_import_pointing_up(tmp_path):
    root = _write(tmp_path, {"kvcache/pool.py": "def f():\n    from kvmesh.router.index import PrefixIndex\n",
                             "router/index.py": "from kvmesh.kvcache.pool import f\n"})
    assert upward_imports(root) == ["kvmesh.kvcache.pool -> kvmesh.router.index"]
    assert circles_in_rooms(root) == {"": [["kvcache", "router"]]}
