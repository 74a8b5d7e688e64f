"""No part of the router is built around the whole object that builds it: a constructor gets what it uses.

Scanned statically over router/: inside a method (a function whose first parameter is ``self``, lambdas and nested
functions in it included), a call that constructs a class defined in router/ (the callee's name, ``Name`` or the
last part of an ``Attribute``, is the name of a ``class`` statement under router/) must not pass the bare name
``self`` as an argument, positional or keyword. Classes of other libraries are out of scope (httptools' parsers
call back the object that owns them by design).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _class_names(trees: dict[Path, ast.Module]) -> set[str]:
    return {node.name for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Starred):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def constructors_given_self(root: Path = ROOT) -> list[str]:
    """``path:line Class(...)`` of every construction of a router class that is given ``self`` (module doc)."""
    trees = {path: ast.parse(path.read_text(), filename=str(path)) for path in sorted((root / "router").rglob("*.py"))}
    classes = _class_names(trees)
    found = []
    for path, tree in trees.items():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = fn.args.posonlyargs + fn.args.args
            if not params or params[0].arg != "self":
                continue
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and _callee(call) in classes and (
                        any(_is_self(a) for a in call.args) or any(_is_self(k.value) for k in call.keywords)):
                    found.append(f"{path.relative_to(root)}:{call.lineno} {_callee(call)}(...)")
    return sorted(set(found))


def test_no_router_class_is_constructed_with_self():
    found = constructors_given_self()
    assert not found, f"constructors given `self` (pass what the part uses instead): {found}"


def test_the_scan_finds_constructors_given_self(tmp_path):
    """The check can fail: ``self`` passed positionally, by keyword or from a lambda is found; a bound method, an
    attribute of ``self`` or another library's class is not."""
    (tmp_path / "router" / "x").mkdir(parents=True)
    (tmp_path / "router" / "x" / "bad.py").write_text('''
import httptools


class Helper:
    def __init__(self, owner, on_change=None):
        self.owner = owner


class Owner:
    def __init__(self):
        self.a = Helper(self)
        self.b = Helper(owner=self)
        self.c = lambda: Helper(self)
        self.fine = Helper(self.a, on_change=self.changed)
        self.parser = httptools.HttpRequestParser(self)

    def changed(self):
        pass


def build(owner):
    return Helper(owner)
''')
    assert [f.split(" ")[0].rsplit(":", 1)[1] for f in constructors_given_self(tmp_path)] == ["12", "13", "14"]
