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


# ---------------------------------------------------------------- the plane: router/http, router/control, router/replicas
PLANE = ("router/http", "router/control", "router/replicas")
"""The rooms where a request and a replica's upkeep reach the replica's record, never its id (module doc)."""
_VIEWS = {"Mapping", "FieldView"}
_ID_NAMES = {"rid", "replica_id"}
_ID_ATTRS = {"id", "replica_id"}
PLANE_MAPS_ALLOWED = {"router/replicas/replica_set.py:ReplicaSet._by_id": "the set itself: id -> record"}
PLANE_EDGES = {
    "router/control/runtime.py:Fleet.request_remove": "the fleet's own call: a replica process by its name",
    "router/control/runtime.py:RouterRuntime.remove_replica": "DELETE /replicas/{id} and the owner's rows (follow.py)",
    "router/control/admin_routes.py:drain_replica": "POST /replicas/{id}/drain",
    "router/control/admin_routes.py:delete_replica": "DELETE /replicas/{id}",
    "router/control/published_loads.py:PublishedLoads._received": "the load feed's intake, by its source's name",
    "router/control/published_loads.py:PublishedLoads._absent": "the load feed's intake, by its source's name",
    "router/replicas/replica_set.py:ReplicaSet.remove": "the set's index by id (the admin's and the simulator's word)",
    "router/replicas/replica_set.py:ReplicaSet.get": "the set's index by id (the edges find a record by it)",
    "router/replicas/replica_set.py:ReplicaSet.__contains__": "the set's index by id",
    "router/replicas/views.py:FieldView.__getitem__": "LoadTracker.loads (router/routing/load.py) reads by id",
    "router/replicas/views.py:FieldView.get": "LoadTracker.loads (router/routing/load.py) reads by id",
    "router/replicas/views.py:FieldView.__contains__": "LoadTracker.loads (router/routing/load.py) reads by id",
}
"""The functions of the plane that take a replica's id, each an edge where an id comes in (HTTP, a feed, the set's
own index), with why."""


def _plane_files(root: Path) -> list[Path]:
    return [path for room in PLANE for path in sorted((root / room).rglob("*.py"))]


def _is_id(node: ast.expr) -> bool:
    """``rid``, ``replica_id``, ``x.id``, ``x.replica_id``: a replica's id as the plane spells it."""
    return (isinstance(node, ast.Name) and node.id in _ID_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in _ID_ATTRS)


def _self_attr(target: ast.expr) -> str | None:
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


def plane_maps(root: Path = ROOT) -> list[str]:
    """``path:Class.attr`` of every mapping keyed by replica id in the plane: an attribute annotated as a dict, set or
    view (``Mapping``, ``FieldView``) keyed by a replica id type, one set to a dict or set comprehension keyed by a
    replica's id, or one set to a ``FieldView``."""
    found = []
    for path in _plane_files(root):
        tree = ast.parse(path.read_text(), filename=str(path))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, ast.AnnAssign):
                    targets, value, annotation = [node.target], node.value, node.annotation
                elif isinstance(node, ast.Assign):
                    targets, value, annotation = node.targets, node.value, None
                else:
                    continue
                for target in targets:
                    attr = _self_attr(target) or (target.id if isinstance(target, ast.Name) and annotation is not None
                                                  and node in cls.body else None)
                    if attr is None:
                        continue
                    keyed = False
                    if annotation is not None and isinstance(annotation, ast.Subscript):
                        outer = annotation.value
                        name = outer.attr if isinstance(outer, ast.Attribute) else getattr(outer, "id", None)
                        args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
                        key = getattr(args[0], "attr", None) or getattr(args[0], "id", None)
                        keyed = name in _CONTAINERS | _VIEWS and key in _ID_TYPES
                    if isinstance(value, ast.DictComp):
                        keyed = keyed or _is_id(value.key)
                    elif isinstance(value, ast.SetComp):
                        keyed = keyed or _is_id(value.elt)
                    elif isinstance(value, ast.Call):
                        func = value.func
                        keyed = keyed or (func.attr if isinstance(func, ast.Attribute) else
                                          getattr(func, "id", None)) in _VIEWS
                    if keyed:
                        found.append(f"{path.relative_to(root)}:{cls.name}.{attr}")
    return sorted(set(found) | {name for name in replica_maps(root) if name.startswith(PLANE)})


def plane_id_parameters(root: Path = ROOT) -> list[str]:
    """``path:Class.function`` (or ``path:function``) of every function in the plane with a parameter named
    ``replica_id``."""
    found = []
    for path in _plane_files(root):
        tree = ast.parse(path.read_text(), filename=str(path))
        owners = {child: node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                  for child in node.body}
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            if "replica_id" in {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}:
                owner = owners.get(fn)
                found.append(f"{path.relative_to(root)}:{owner + '.' if owner else ''}{fn.name}")
    return sorted(found)


def http_protocols(root: Path = ROOT) -> list[str]:
    """``path:Class`` of every ``typing.Protocol`` class in router/http (``asyncio.Protocol``, a transport's
    callbacks, is not one)."""
    found = []
    for path in sorted((root / "router" / "http").rglob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            if any((isinstance(b, ast.Name) and b.id == "Protocol") or
                   (isinstance(b, ast.Attribute) and b.attr == "Protocol" and getattr(b.value, "id", "") == "typing")
                   for b in cls.bases):
                found.append(f"{path.relative_to(root)}:{cls.name}")
    return found


def test_the_plane_keeps_no_map_keyed_by_replica_id():
    extra = [name for name in plane_maps() if name not in PLANE_MAPS_ALLOWED]
    assert not extra, f"maps keyed by replica id in {', '.join(PLANE)}; keep the state on the record: {extra}"


def test_the_plane_takes_a_replica_id_only_at_its_edges():
    extra = [name for name in plane_id_parameters() if name not in PLANE_EDGES]
    assert not extra, f"functions taking a replica_id in {', '.join(PLANE)}; pass the Replica record: {extra}"
    assert set(plane_id_parameters()) >= set(PLANE_EDGES), set(PLANE_EDGES) - set(plane_id_parameters())


def test_the_data_plane_reads_the_router_through_one_protocol_at_most():
    found = http_protocols()
    assert len(found) <= 1, f"router/http declares {found}; give its parts the DataPlane (router/http/data_plane.py)"


def test_the_plane_scans_can_fail(tmp_path):
    """Each scan finds what it is for, in each form it knows, and passes over what it is not."""
    (tmp_path / "router" / "http").mkdir(parents=True)
    (tmp_path / "router" / "http" / "bad.py").write_text('''
import asyncio
from typing import Protocol

class Reads(Protocol):
    def mark_failed(self, replica_id: str) -> None: ...

class Counted(Protocol): ...

class Conn(asyncio.Protocol): ...

class Keeper:
    kinds: Mapping[ReplicaId, str]

    def __init__(self, replicas):
        self.specs = FieldView(replicas, "spec")
        self.urls = {r.id: r.spec.url for r in replicas}
        self.up = {rid for rid in replicas}
        self.by_tenant = {t.name: t for t in replicas}

    def drop(self, replica: Replica) -> None: ...

def count(replica_id: str) -> None: ...
''')
    assert http_protocols(tmp_path) == ["router/http/bad.py:Reads", "router/http/bad.py:Counted"]
    assert plane_maps(tmp_path) == [f"router/http/bad.py:Keeper.{a}" for a in ("kinds", "specs", "up", "urls")]
    assert plane_id_parameters(tmp_path) == ["router/http/bad.py:Reads.mark_failed", "router/http/bad.py:count"]
