"""One word per concept: "transfer" is KV moved between replicas only. The host tier's copies are named
after the tier (offload copies, loads and stores, as vLLM's offloading connector names them), so no identifier on
the host tier's path says "transfer": not a name, an attribute, a function, a class, an argument or an import.

The path: where the tier is planned (kvcache/), where its copies leave with the step and come back (the scheduler,
the step contract, the engine and its connector for the tier), where they are made (the runner and its copier),
and the interfaces they cross. Files are found by name anywhere in their package, so a move keeps the guard.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HOST_TIER_PATH = {
    "kvcache": ["offload_copies.py", "offload.py", "host_tier.py", "kv_cache_manager.py", "pool_integrity.py"],
    "replica": ["offload_connector.py", "scheduler.py", "scheduler_output.py", "llm_engine.py", "kv_offload.py",
                "model_runner.py", "fake_runner.py", "interfaces.py", "kv_layout.py"],
}


def _path(package: str, name: str) -> Path:
    found = [p for p in (ROOT / package).rglob(name) if "__pycache__" not in p.parts]
    assert len(found) == 1, f"{package}/**/{name}: expected one file, found {found}"
    return found[0]


def identifiers(tree: ast.AST) -> set[str]:
    """Every name the code spells: names, attributes, definitions, arguments, keywords, imports."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.arg) or isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.update(n for n in (node.name, node.asname) if n)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package,name", [(p, n) for p, names in HOST_TIER_PATH.items() for n in names])
def test_no_identifier_on_the_host_tier_path_says_transfer(package, name):
    path = _path(package, name)
    offending = sorted(i for i in identifiers(ast.parse(path.read_text())) if "transfer" in i.lower())
    assert not offending, f"{path.relative_to(ROOT)} names {offending}: the host tier's copies are offload " \
                          "copies (loads, stores); \"transfer\" is KV moved between replicas"


def test_the_guard_sees_a_transfer_name():
    assert "take_transfers" in identifiers(ast.parse("manager.take_transfers()"))
