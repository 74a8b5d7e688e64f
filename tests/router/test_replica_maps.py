"""What the router knows of a replica lives on its record (router/replicas/replica.py), not in maps keyed by its id.

Scanned statically over router/: an attribute is a *replica-keyed map* when it is annotated (``self.x: T = ...`` or
a class-level ``x: T``) with a dict or set type (``dict``, ``set``, ``frozenset``, ``defaultdict``,
``OrderedDict``, ``MutableMapping``) whose key type is a replica id -- ``ReplicaId`` or ``Hashable``, the names the
router gives a replica's id -- or whose key type is ``str`` while the docstring under it starts with
``Replica id ->`` or ``Replicas``. Views (``Mapping``, ``FieldView``) and properties hold nothing and are not maps.
Only the maps of ``ALLOWED`` may exist, each for the reason given.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CONTAINERS = {"dict", "set", "frozenset", "defaultdict", "OrderedDict", "MutableMapping", "Dict", "Set"}
_ID_TYPES = {"ReplicaId", "Hashable"}

ALLOWED = {
    "router/replicas/replica_set.py:ReplicaSet._by_id": "the set itself: id -> record",
    "router/routing/index.py:PrefixIndex._replicas": "the index's slots: each replica's bit in the block masks",
    # A peer's formula keeps the state that router keeps, in that router's shape (its own trackers by worker):
    "router/routing/policies/dynamo.py:ActiveBlocks.blocks": "Dynamo's router-local active blocks per worker",
    "router/routing/policies/dynamo.py:ActiveBlocks.requests": "Dynamo's router-local requests per worker",
    "router/routing/policies/llmd.py:RoutedPrefixes.servers": "llm-d's approximate prefix index of its own routing",
    "router/routing/policies/sglang.py:ApproximateTree.lru": "sglang-router's tree of the requests it routed",
}


def _key_name(annotation: ast.expr) -> tuple[str, str] | None:
    """(container, key type) of ``dict[K, V]`` / ``set[K]`` and the like; None for anything else."""
    if not isinstance(annotation, ast.Subscript):
        return None
    outer = annotation.value
    name = outer.attr if isinstance(outer, ast.Attribute) else getattr(outer, "id", None)
    if name not in _CONTAINERS:
        return None
    args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    key = args[0]
    key_name = key.attr if isinstance(key, ast.Attribute) else getattr(key, "id", None)
    return (name, key_name) if key_name is not None else None


def _doc_after(body: list[ast.stmt], i: int) -> str:
    nxt = body[i + 1] if i + 1 < len(body) else None
    if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
        return nxt.value.value.strip()
    return ""


def replica_maps(root: Path = ROOT) -> list[str]:
    """``path:Class.attr`` of every replica-keyed map under ``root``/router (module doc)."""
    found = []
    for path in sorted((root / "router").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            bodies = [cls.body] + [f.body for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
            for body in bodies:
                for i, stmt in enumerate(body):
                    if not isinstance(stmt, ast.AnnAssign):
                        continue
                    target = stmt.target
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        attr = target.attr
                    elif isinstance(target, ast.Name) and body is cls.body:
                        attr = target.id
                    else:
                        continue
                    kind = _key_name(stmt.annotation)
                    if kind is None:
                        continue
                    doc = _doc_after(body, i)
                    if kind[1] in _ID_TYPES or (kind[1] == "str" and doc.startswith(("Replica id ->", "Replicas"))):
                        found.append(f"{path.relative_to(root)}:{cls.name}.{attr}")
    return sorted(set(found))


def test_replica_state_lives_on_the_record():
    extra = [name for name in replica_maps() if name not in ALLOWED]
    assert not extra, ("maps keyed by replica id outside the replica set; put the state on the record "
                       f"(router/replicas/replica.py): {extra}")


def test_the_allowed_maps_still_exist():
    """An allowance whose map went away is dropped from ``ALLOWED`` too."""
    assert set(replica_maps()) >= set(ALLOWED), set(ALLOWED) - set(replica_maps())


def test_the_scan_finds_replica_keyed_maps(tmp_path):
    """The check can fail: maps keyed by a replica id in each of the forms it knows are found, others are not."""
    (tmp_path / "router" / "x").mkdir(parents=True)
    (tmp_path / "router" / "x" / "bad.py").write_text('''
from collections.abc import Hashable, Mapping

class Tracker:
    per_replica: dict[ReplicaId, int]

    def __init__(self):
        self.healthy: set[Hashable] = set()
        self.causes: dict[ReplicaId, dict[str, str]] = {}
        self.kinds: dict[str, str] = {}
        """Replica id -> what it accepts."""
        self.draining: set[str] = set()
        """Replicas that get no new requests."""
        self.tenants: dict[str, int] = {}
        """Tenant -> its share (not a replica's)."""
        self.view: Mapping[ReplicaId, int] = {}
        self.blocks: dict[int, int] = {}
''')
    assert replica_maps(tmp_path) == [f"router/x/bad.py:Tracker.{a}"
                                      for a in ("causes", "draining", "healthy", "kinds", "per_replica")]
