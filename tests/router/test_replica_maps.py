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


# ---------------------------------------------------------------- the routing room's parameters
ROUTING_ID_EDGES = {
    # the replica set's own edges: a replica comes, goes, or reports, named by its id
    "router/routing/kv_router.py:KVRouter.add_replica": "registers a replica by id (the plane, the simulator)",
    "router/routing/kv_router.py:KVRouter.remove_replica": "forgets a replica by id (admin, the fleet)",
    "router/routing/kv_router.py:KVRouter.apply_events": "event intake: a batch names its publisher by id",
    "router/routing/load.py:LoadTracker.add_replica": "a tracker of its own (tests, tools) registers by id",
    "router/routing/load.py:LoadTracker.remove_replica": "a tracker of its own forgets by id",
    # the prefix index names each slot's owner by id: its matches are id -> blocks, the policies' key
    "router/routing/index.py:PrefixIndex.add_replica": "a slot for the id its matches will name",
    "router/routing/index.py:PrefixIndex.remove_replica": "frees the id's slots",
    "router/routing/index.py:PrefixIndex.clear_replica": "drops the id's blocks",
    "router/routing/index.py:PrefixIndex.apply": "event intake: a batch names its publisher by id",
    "router/routing/index.py:PrefixIndex.predict": "credits the id the decision chose (a key of its matches)",
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
    "router/routing/receipts.py:route_receipt": "reads the decision's id-keyed tiers and loads",
    "router/routing/cost/candidates.py:price_one": "prices one key of the candidates' id-keyed loads",
    # a peer's formula keeps that router's own per-worker state (see ALLOWED above)
    "router/routing/policies/dynamo.py:ActiveBlocks.release": "Dynamo's per-worker tracker",
    "router/routing/policies/dynamo.py:ActiveBlocks.with_request": "Dynamo's per-worker tracker",
    "router/routing/policies/dynamo.py:ActiveBlocks.add": "Dynamo's per-worker tracker",
    "router/routing/policies/llmd.py:RoutedPrefixes.match": "llm-d's per-server prefix index",
    "router/routing/policies/llmd.py:RoutedPrefixes.add": "llm-d's per-server prefix index",
}
"""Functions of router/routing/ that may take a ``replica_id`` parameter, each for the reason given."""
ROUTING_ID_PENDING = {
    "router/routing/kv_router.py:KVRouter.set_healthy": "its callers in router/control/ hold ids yet",
    "router/routing/kv_router.py:KVRouter.clear_cache": "its callers in router/control/ hold ids yet",
    "router/routing/kv_router.py:KVRouter.set_degraded": "its callers in router/control/ hold ids yet",
}
"""Functions that take an id although they are not edges: what is left to turn to records (none may be added)."""


def id_parameters(root: Path = ROOT, folder: str = "router/routing") -> list[str]:
    """``path:Class.function`` (or ``path:function``) of every function under ``folder`` with a parameter named
    ``replica_id``."""
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        owners = {id(f): cls.name for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                  for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            args = fn.args
            if any(a.arg == "replica_id" for a in args.posonlyargs + args.args + args.kwonlyargs):
                owner = owners.get(id(fn))
                found.append(f"{path.relative_to(root)}:{owner + '.' if owner else ''}{fn.name}")
    return sorted(set(found))


def test_routing_takes_records_and_ids_only_at_its_edges():
    extra = [name for name in id_parameters() if name not in ROUTING_ID_EDGES and name not in ROUTING_ID_PENDING]
    assert not extra, ("functions of router/routing/ taking a replica_id outside its edges; take the Replica "
                       f"record (router/replicas/replica.py): {extra}")


def test_the_allowed_id_parameters_still_exist():
    """An allowance whose function no longer takes an id is dropped from the lists too."""
    found = set(id_parameters())
    gone = (set(ROUTING_ID_EDGES) | set(ROUTING_ID_PENDING)) - found
    assert not gone, gone
    assert not set(ROUTING_ID_EDGES) & set(ROUTING_ID_PENDING)


def test_the_scan_finds_replica_id_parameters(tmp_path):
    """The check can fail: a method, a function and a keyword-only parameter named replica_id are found."""
    (tmp_path / "router" / "routing").mkdir(parents=True)
    (tmp_path / "router" / "routing" / "bad.py").write_text('''
class Tracker:
    def on_dispatch(self, replica_id, tokens): ...
    def on_finish(self, replica, tokens): ...

def health(*, replica_id): ...
async def probe(replica_ids): ...
''')
    assert id_parameters(tmp_path) == ["router/routing/bad.py:Tracker.on_dispatch", "router/routing/bad.py:health"]
