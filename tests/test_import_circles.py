"""Import circles as a reader follows them: every kvmesh import (module level, inside functions, under
``TYPE_CHECKING``) is an edge, and a circle is a group of modules that reach each other (a strongly
connected component of that graph). ARCHITECTURE.md, "Layout and layering": at most two, and each one
says why where it is, in a comment starting ``# import circle:`` in one of its modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("kvcache", "events", "replica", "router", "cluster")
MAX_CIRCLES = 2


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


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """kvmesh module -> the kvmesh modules it imports anywhere in its text."""
    mods = kvmesh_modules(root)

    def owner(name: str) -> str | None:  # `from kvmesh.a.b import C` -> kvmesh.a.b (or kvmesh.a.b.C, a module)
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = owner(name) if name.startswith("kvmesh.") else None
                package_of_self = target and mods[target].name == "__init__.py" and module.startswith(target + ".")
                if target and target != module and not package_of_self:
                    graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
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


def _explained(group: list[str], root: Path = ROOT) -> bool:
    mods = kvmesh_modules(root)
    return any("# import circle:" in mods[m].read_text() for m in group)


def test_at_most_two_import_circles_each_with_its_reason():
    found = circles(import_graph())
    assert len(found) <= MAX_CIRCLES, "import circles:\n" + "\n".join(", ".join(g) for g in found)
    unexplained = [g for g in found if not _explained(g)]
    assert unexplained == [], f"circles without a '# import circle:' comment saying why: {unexplained}"


def test_the_check_sees_a_circle_through_a_type_checking_import(tmp_path):
    """The check itself can fail: two modules naming each other's types, one only for the type checker."""
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "a.py").write_text("from kvmesh.router.b import B\nclass A: ...\n")
    (tmp_path / "router" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvmesh.router.a import A\nclass B: ...\n")
    (tmp_path / "router" / "c.py").write_text("def f():\n    from kvmesh.router.a import A\n")
    assert circles(import_graph(tmp_path)) == [["kvmesh.router.a", "kvmesh.router.b"]]
