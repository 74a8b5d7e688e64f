"""Functions a newcomer can read in one screen: none of the package source over ``MAX_LINES`` lines, and the two a
request's path turns on (``KVRouter.route``, ``Forwarder.dispatch``) within ``MAX_HOT_LINES``.

A function's length counts its lines from its ``def`` to the last line of its body, the signature and docstring
included, its decorators not (``ast``'s ``end_lineno - lineno + 1``); a nested function counts in its enclosing
function too. ``cluster/measure/`` (benchmarks and the simulator) is left out, and so are Triton kernels (functions
decorated with ``@triton.jit``): a kernel is one unit of GPU code, its loops are not split into calls.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kvcache", "events", "router", "replica", "cluster")
"""The package source (setup.py's ``TOP_LEVEL``)."""
LEFT_OUT = ("cluster/measure/",)
MAX_LINES = 60
MAX_HOT_LINES = 40
HOT = {"router/routing/kv_router.py": "KVRouter.route", "router/http/proxy.py": "Forwarder.dispatch"}
"""File -> the qualified name held to ``MAX_HOT_LINES``."""


def _is_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with ``triton.jit`` (or ``jit`` imported from triton), with or without arguments."""
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if ast.unparse(target) in ("triton.jit", "jit"):
            return True
    return False


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, length in lines, node) of every function and method under ``tree``, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            yield name, node.end_lineno - node.lineno + 1, node
            yield from _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _source_files() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(LEFT_OUT):
                yield rel, path


def _lengths() -> Iterator[tuple[str, str, int, bool]]:
    """(file, qualified name, length, is a kernel) of every function of the package source."""
    for rel, path in _source_files():
        for name, length, node in _functions(ast.parse(path.read_text(), filename=rel)):
            yield rel, name, length, _is_kernel(node)


def test_no_function_is_longer_than_a_screen():
    long = [f"{rel}: {name} ({length} lines)" for rel, name, length, kernel in _lengths()
            if length > MAX_LINES and not kernel]
    assert not long, (f"{len(long)} functions over {MAX_LINES} lines; split them by meaning (helpers named for what "
                      "they do):\n  " + "\n  ".join(long))


def test_a_requests_route_and_dispatch_read_at_a_glance():
    found = {(rel, name): length for rel, name, length, _ in _lengths() if HOT.get(rel) == name}
    assert set(found) == set(HOT.items()), f"not found: {set(HOT.items()) - set(found)}"
    long = [f"{rel}: {name} ({length} lines)" for (rel, name), length in found.items() if length > MAX_HOT_LINES]
    assert not long, f"over {MAX_HOT_LINES} lines:\n  " + "\n  ".join(long)


def test_the_count_sees_what_it_should():
    tree = ast.parse("@triton.jit\ndef kernel(x):\n    pass\n\n\nclass A:\n    @staticmethod\n"
                     "    def f(self):\n        def inner():\n            pass\n        return inner\n")
    found = {name: (length, _is_kernel(node)) for name, length, node in _functions(tree)}
    assert found == {"kernel": (2, True), "A.f": (4, False), "A.f.inner": (2, False)}
