"""What the router knows of a replica lives on its record (router/replicas/replica.py), and the record is what its
functions pass: not maps keyed by the replica's id, not the id.

Scanned statically over router/:

- a *replica-keyed map* is an attribute (``self.x`` or a class-level ``x``) annotated with a dict, set or view type
  (``dict``, ``set``, ``frozenset``, ``defaultdict``, ``OrderedDict``, ``MutableMapping``, ``Mapping``,
  ``FieldView``) whose key type is a replica id -- ``ReplicaId`` or ``Hashable``, the names the router gives a
  replica's id -- or whose key type is ``str`` while the docstring under it starts with ``Replica id ->`` or
  ``Replicas``; or one set to a dict or set comprehension keyed by a replica's id (``rid``, ``replica_id``,
  ``x.id``, ``x.replica_id``), or to a ``FieldView``. Only the maps of ``ALLOWED`` may exist, each for its reason.
- a function may take a parameter named ``replica_id`` only at the router's edges (``ID_EDGES``), where an id comes
  in: admin HTTP, the event and load feeds, the set's own index, state shared between routers, a peer router's
  formula. Each is listed with its reason.
- a *lookup by id* is a read of the replica set by a replica's id (``replicas.get``, called or bound, or
  ``replicas[...]``) outside the set itself: what an edge does once, where an id comes in.
- router/http reads the router through one ``typing.Protocol`` at most (its parts get the ``DataPlane``).

The ceilings below hold the counts where they are, so they cannot grow back; ``python
tests/router/test_replica_maps.py``
prints them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MAX_ID_PARAMETERS = 29
"""Functions of router/ taking a ``replica_id`` (the edges of ``ID_EDGES``): lower it when one goes."""
MAX_ID_LOOKUPS = 10
"""Lookups of a record by id in router/ (``replica_lookups``): lower it when one goes."""

_CONTAINERS = {"dict", "set", "frozenset", "defaultdict", "OrderedDict", "MutableMapping", "Dict", "Set"}
_VIEWS = {"Mapping", "FieldView"}
_ID_TYPES = {"ReplicaId", "Hashable"}
_ID_NAMES = {"rid", "replica_id"}
_ID_ATTRS = {"id", "replica_id"}

ALLOWED = {
    "router/replicas/replica_set.py:ReplicaSet._by_id": "the set itself: id -> record",
    "router/routing/index.py:PrefixIndex._replicas": "the index's slots: each replica's bit in the block masks",
}
"""The replica-keyed maps the router may keep, each for the reason given."""

ID_EDGES = {
    # the replica set's own edges: a replica comes, goes, or reports, named by its id
    "router/replicas/replica_set.py:ReplicaSet.remove": "the set's index by id (the admin's and the simulator's word)",
    "router/replicas/replica_set.py:ReplicaSet.get": "the set's index by id (the edges find a record by it)",
    "router/replicas/replica_set.py:ReplicaSet.__contains__": "the set's index by id",
    "router/routing/kv_router.py:KVRouter.add_replica": "registers a replica by id (the plane, the simulator)",
    "router/routing/kv_router.py:KVRouter.remove_replica": "forgets a replica by id (admin, the fleet)",
    "router/routing/event_intake.py:EventIntake.apply_events": "event intake: a batch names its publisher by id",
    # admin HTTP and the feeds: an id comes in over the wire
    "router/control/runtime.py:Fleet.request_remove": "the fleet's own call: a replica process by its name",
    "router/control/runtime.py:RouterRuntime.remove_replica": "DELETE /replicas/{id} and the owner's rows (follow.py)",
    "router/control/admin_routes.py:drain_replica": "POST /replicas/{id}/drain",
    "router/control/admin_routes.py:delete_replica": "DELETE /replicas/{id}",
    "router/control/published_loads.py:PublishedLoads._received": "the load feed's intake, by its source's name",
    "router/control/published_loads.py:PublishedLoads._absent": "the load feed's intake, by its source's name",
    # the prefix index names each slot's owner by id: its matches are id -> blocks, the policies' key
    "router/routing/index.py:PrefixIndex.add_replica": "a slot for the id its matches will name",
    "router/routing/index.py:PrefixIndex.remove_replica": "frees the id's slots",
    "router/routing/index.py:PrefixIndex.clear_replica": "drops the id's blocks",
    "router/routing/index.py:PrefixIndex.apply": "event intake: a batch names its publisher by id",
    "router/routing/index.py:PrefixIndex.predict": "credits the id the decision chose (a key of its matches)",
    "router/routing/index.py:PrefixIndex.predict_held": "predict, held until its request's first bytes",
    "router/routing/index.py:PrefixIndex.num_blocks": "admin and /replicas report blocks per id",
    "router/routing/index.py:PrefixIndex.cached_hashes": "admin: the hashes an id holds",
    # shared between router processes and routers: only an id means the same replica in each
    "router/routing/shared_loads.py:SharedLoadTable.slot": "a column of the host's shared memory per id",
    "router/routing/shared_loads.py:_name": "the shared segment's name for an id",
    "router/routing/session.py:SessionTable.pin": "pins shared between routers name the replica by id",
    # mappings keyed by id (the candidates' loads, their prices): a Mapping is asked by its key
    "router/routing/cost/load_columns.py:LoadColumns.row": "the row of an id in the columns",
    "router/routing/cost/load_columns.py:CandidateLoads.__getitem__": "Mapping protocol (id -> load)",
    "router/routing/cost/load_columns.py:CandidateLoads.__contains__": "Mapping protocol",
    "router/routing/cost/prices.py:Prices.__getitem__": "Mapping protocol (id -> estimate)",
    "router/routing/cost/prices.py:Prices.__contains__": "Mapping protocol",
    "router/routing/cost/candidates.py:price_one": "prices one key of the candidates' id-keyed loads",
}
"""Functions of router/ that may take a ``replica_id`` parameter: the edges where an id comes in, each with why."""


def _functions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(Class.function or function, node)`` of every function in ``tree``."""
    owners = {id(f): cls.name for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
              for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    return [(f"{owners[id(fn)]}.{fn.name}" if id(fn) in owners else fn.name, fn) for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)]


def _sources(root: Path) -> list[tuple[str, ast.AST]]:
    return [(str(path.relative_to(root)), ast.parse(path.read_text(), filename=str(path)))
            for path in sorted((root / "router").rglob("*.py"))]


def _key_name(annotation: ast.expr) -> str | None:
    """The key type of ``dict[K, V]`` / ``set[K]`` / ``Mapping[K, V]`` and the like; None for anything else."""
    if not isinstance(annotation, ast.Subscript):
        return None
    outer = annotation.value
    name = outer.attr if isinstance(outer, ast.Attribute) else getattr(outer, "id", None)
    if name not in _CONTAINERS | _VIEWS:
        return None
    args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    key = args[0]
    return key.attr if isinstance(key, ast.Attribute) else getattr(key, "id", None)


def _doc_after(body: list[ast.stmt], stmt: ast.stmt) -> str:
    i = next((k for k, s in enumerate(body) if s is stmt), None)
    nxt = body[i + 1] if i is not None and i + 1 < len(body) else None
    if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
        return nxt.value.value.strip()
    return ""


def _is_id(node: ast.expr) -> bool:
    """``rid``, ``replica_id``, ``x.id``, ``x.replica_id``: a replica's id as the router spells it."""
    return (isinstance(node, ast.Name) and node.id in _ID_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in _ID_ATTRS)


def _keyed_by_id(stmt: ast.Assign | ast.AnnAssign, doc: str) -> bool:
    """Whether the assignment makes a replica-keyed map (module doc)."""
    annotation = stmt.annotation if isinstance(stmt, ast.AnnAssign) else None
    key = _key_name(annotation) if annotation is not None else None
    if key in _ID_TYPES or (key == "str" and doc.startswith(("Replica id ->", "Replicas"))):
        return True
    value = stmt.value
    if isinstance(value, ast.DictComp):
        return _is_id(value.key)
    if isinstance(value, ast.SetComp):
        return _is_id(value.elt)
    if isinstance(value, ast.Call):
        func = value.func
        return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in _VIEWS
    return False


def replica_maps(root: Path = ROOT) -> list[str]:
    """``path:Class.attr`` of every replica-keyed map under ``root``/router (module doc)."""
    found = []
    for path, tree in _sources(root):
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            bodies = [cls.body] + [f.body for f in ast.walk(cls) if isinstance(f,
                                                                               ast.FunctionDef | ast.AsyncFunctionDef)]
            for body in bodies:
                for stmt in body:
                    if not isinstance(stmt, ast.Assign | ast.AnnAssign):
                        continue
                    for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                and target.value.id == "self":
                            attr = target.attr
                        elif isinstance(target, ast.Name) and body is cls.body and isinstance(stmt, ast.AnnAssign):
                            attr = target.id
                        else:
                            continue
                        if _keyed_by_id(stmt, _doc_after(body, stmt)):
                            found.append(f"{path}:{cls.name}.{attr}")
    return sorted(set(found))


def id_parameters(root: Path = ROOT) -> list[str]:
    """``path:Class.function`` (or ``path:function``) of every function under ``root``/router with a parameter
    named ``replica_id``."""
    found = []
    for path, tree in _sources(root):
        for name, fn in _functions(tree):
            args = fn.args
            if any(a.arg == "replica_id" for a in args.posonlyargs + args.args + args.kwonlyargs):
                found.append(f"{path}:{name}")
    return sorted(set(found))


def replica_lookups(root: Path = ROOT) -> list[str]:
    """``path:line`` of every lookup of a record by id under ``root``/router (module doc): ``replicas.get`` (called or
    bound) or ``replicas[...]``, where ``replicas`` is a name or an attribute (``self.replicas``,
    ``svc.router.replicas``); the set's own file (router/replicas/replica_set.py) is its inside, not a lookup."""
    found = []
    for path, tree in _sources(root):
        if path == "router/replicas/replica_set.py":
            continue
        for node in ast.walk(tree):
            owner = node.value if isinstance(node, ast.Subscript) or (
                isinstance(node, ast.Attribute) and node.attr == "get") else None
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            if name == "replicas":
                found.append((path, node.lineno))
    return [f"{path}:{line}" for path, line in sorted(found)]


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


def test_replica_state_lives_on_the_record():
    extra = [name for name in replica_maps() if name not in ALLOWED]
    assert not extra, ("maps keyed by replica id outside the replica set; put the state on the record "
                       f"(router/replicas/replica.py): {extra}")


def test_the_router_takes_records_and_ids_only_at_its_edges():
    extra = [name for name in id_parameters() if name not in ID_EDGES]
    assert not extra, ("functions of router/ taking a replica_id outside its edges; take the Replica record "
                       f"(router/replicas/replica.py): {extra}")


def test_the_counts_stay_under_their_ceilings():
    params, lookups = id_parameters(), replica_lookups()
    assert len(params) <= MAX_ID_PARAMETERS, f"{len(params)} functions take a replica_id: {params}"
    assert len(lookups) <= MAX_ID_LOOKUPS, (f"{len(lookups)} lookups of a record by id (pass the Replica record "
                                            f"instead): {lookups}")


def test_the_allowances_still_exist():
    """An allowance whose map or function went away (or takes no id now) is dropped from its list too."""
    assert set(replica_maps()) >= set(ALLOWED), set(ALLOWED) - set(replica_maps())
    gone = set(ID_EDGES) - set(id_parameters())
    assert not gone, gone


def test_the_data_plane_reads_the_router_through_one_protocol_at_most():
    found = http_protocols()
    assert len(found) <= 1, f"router/http declares {found}; give its parts the DataPlane (router/http/data_plane.py)"


def test_the_scans_can_fail(tmp_path):
    """Each scan finds what it is for, in each form it knows, and passes over what it is not."""
    (tmp_path / "router" / "http").mkdir(parents=True)
    (tmp_path / "router" / "http" / "bad.py").write_text('''
import asyncio
from collections.abc import Hashable, Mapping
from typing import Protocol

class Reads(Protocol):
    def mark_failed(self, replica_id: str) -> None: ...

class Counted(Protocol): ...

class Conn(asyncio.Protocol): ...

class Tracker:
    per_replica: dict[ReplicaId, int]
    kinds: Mapping[ReplicaId, str]

    def __init__(self, replicas):
        self.healthy: set[Hashable] = set()
        self.causes: dict[ReplicaId, dict[str, str]] = {}
        self.accepts: dict[str, str] = {}
        """Replica id -> what it accepts."""
        self.draining: set[str] = set()
        """Replicas that get no new requests."""
        self.tenants: dict[str, int] = {}
        """Tenant -> its share (not a replica's)."""
        self.blocks: dict[int, int] = {}
        self.specs = FieldView(replicas, "spec")
        self.urls = {r.id: r.spec.url for r in replicas}
        self.up = {rid for rid in replicas}
        self.by_tenant = {t.name: t for t in replicas}

    def on_dispatch(self, replica_id, tokens): ...
    def on_finish(self, replica, tokens): ...

def health(*, replica_id): ...
async def probe(replica_ids): ...

def looks_up(svc, rid, index):
    svc.router.replicas.get(rid)
    get = replicas.get
    svc.replicas[rid]
    index._replicas.get(rid)
    svc.router.loads.get(rid)
''')
    assert http_protocols(tmp_path) == ["router/http/bad.py:Reads", "router/http/bad.py:Counted"]
    assert replica_maps(tmp_path) == [f"router/http/bad.py:Tracker.{a}" for a in (
        "accepts", "causes", "draining", "healthy", "kinds", "per_replica", "specs", "up", "urls")]
    assert id_parameters(tmp_path) == ["router/http/bad.py:Reads.mark_failed", "router/http/bad.py:Tracker.on_dispatch",
                                       "router/http/bad.py:health"]
    assert replica_lookups(tmp_path) == ["router/http/bad.py:39", "router/http/bad.py:40", "router/http/bad.py:41"]


if __name__ == "__main__":
    print(f"functions taking a replica_id: {len(id_parameters())} (ceiling {MAX_ID_PARAMETERS}); "
          f"lookups of a record by id: {len(replica_lookups())} (ceiling {MAX_ID_LOOKUPS})")
