"""The layering of ARCHITECTURE.md, enforced: which kvmesh package may import which.

    kvcache   stdlib, xxhash, kvmesh.events.schema
    events    stdlib, msgspec, pyzmq
    router    kvcache (hashing, reuse), events, kvmesh.replica.serving (the torch-free serving core),
              kvmesh.replica.openai (the OpenAI HTTP layer on top of it), HTTP libs
    replica   everything above, torch, transformers (not router/, not cluster/)
      replica/serving  itself only, and no torch, no HTTP framework (the engine and the router both import it)
      replica/openai   the serving core and itself; never torch
      replica/server   the replica's HTTP server: openai/ over this replica's engine
      the engine core  (engine/, worker/, sample/, attention/, layers/, models/) never the OpenAI layer
    cluster   everything

The router's rooms (ARCHITECTURE.md, "The router"), one way down: control -> http -> routing -> replicas.

    router/replicas  the replica record and the set of them: itself, the serving core and the load message only
    router/admission admission's policy core (queue, tenants, fair share, limits, deadlines): itself only, no I/O
    router/routing   routing itself, the compiled fast path, kvcache hashing and reuse, the event schema and the load
                     message, the serving
                     core -- no HTTP library, never the data plane or control (pure decisions, no I/O)
    router/http      the data plane: never control (the running router gives it one ``DataPlane`` of
                     data_plane.py), never aiohttp (its own client) or FastAPI
    router/control   every room; its HTTP calls (probes, a serve worker's control router) go through the
                     data plane's client too, not aiohttp

Checked statically on every module-level and function-level import, so a lazy import inside a function
counts too. tests/router/test_no_torch.py checks the router's torch-freedom at run time as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Per package: the kvmesh modules it may import (prefixes) and the third-party modules it may not.
RULES = {
    "kvcache": (("kvmesh.kvcache", "kvmesh.events.schema"), ("torch", "ray", "transformers", "zmq", "fastapi")),
    "events": (("kvmesh.events",), ("torch", "ray", "transformers", "fastapi", "uvicorn")),
    "router": (("kvmesh.router", "kvmesh.kvcache.hashing", "kvmesh.kvcache.reuse", "kvmesh.events",
                "kvmesh.replica.serving", "kvmesh.replica.openai"), ("torch", "ray", "transformers")),
    "replica": (("kvmesh.replica", "kvmesh.kvcache", "kvmesh.events"), ()),
    "replica/serving": (("kvmesh.replica.serving",), ("torch", "ray", "fastapi", "starlette", "uvicorn", "zmq")),
    "replica/openai": (("kvmesh.replica.serving", "kvmesh.replica.openai"), ("torch", "ray")),
}

# What a room may name for its annotations only (under ``TYPE_CHECKING``, test_type_only_imports_stay_type_only):
# the replica record holds what admission learned of its slots.
TYPE_ONLY = {"router/replicas": ("kvmesh.router.admission.room",)}

# Per room of the router: the kvmesh modules it may import (prefixes) and the third-party modules it may not.
_HTTP_LIBS = ("fastapi", "starlette", "uvicorn", "aiohttp", "httptools", "httpx")
ROOMS = {
    "router/replicas": (("kvmesh.router.replicas", "kvmesh.replica.serving",
                         "kvmesh.events.load") + TYPE_ONLY["router/replicas"], _HTTP_LIBS),
    "router/routing": (("kvmesh.router.routing", "kvmesh.router.replicas", "kvmesh.router._fastpath",
                        "kvmesh.kvcache.hashing",
                        "kvmesh.kvcache.reuse", "kvmesh.events.schema", "kvmesh.events.load", "kvmesh.replica.serving"),
                       _HTTP_LIBS),
    "router/admission": (("kvmesh.router.admission",), _HTTP_LIBS),
    "router/http": (("kvmesh.router.http", "kvmesh.router.replicas", "kvmesh.router.routing", "kvmesh.router.admission",
                     "kvmesh.router.config",
                     "kvmesh.replica.serving",
                     "kvmesh.replica.openai"), ("fastapi", "starlette", "uvicorn", "aiohttp")),
    "router/control": (("kvmesh.router", "kvmesh.events", "kvmesh.replica.serving", "kvmesh.replica.openai"),
                       ("aiohttp", "httpx")),
}

# The replica's HTTP side is openai/ (torch-free, shared with the router), server/ (the replica's HTTP server
# over its engine) and the top-level modules that wire it to the engine; the engine core (engine/, worker/,
# sample/, attention/, layers/, models/) and serving/ never import the OpenAI layer.
REPLICA_HTTP = ("runtime.py", "actor.py")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in ("kvmesh.replica", "kvmesh.router"):  # `from kvmesh.router import x`: kvmesh.router.x
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                names.add(node.module)
    return names


def _violations(package: str, root: Path = ROOT) -> dict[str, list[str]]:
    allowed, forbidden = RULES[package] if package in RULES else ROOMS[package]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        bad = sorted(
            name for name in _imports(path)
            if (name.startswith("kvmesh.") and not name.startswith(allowed))
            or name.split(".")[0] in forbidden
        )
        if bad:
            found[str(path.relative_to(root))] = bad
    return found


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_imports_only_what_the_layering_allows(package):
    assert _violations(package) == {}, f"{package}/ breaks the layering of ARCHITECTURE.md"


def test_the_engine_core_never_imports_the_openai_layer():
    """The engine reaches the detokenizer, load report and metric buckets through the serving core."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(n for n in _imports(path) if n.startswith("kvmesh.replica.openai"))
        for path in sorted((ROOT / "replica").rglob("*.py"))
        if path.relative_to(ROOT / "replica").parts[0] not in ("openai", "server")  # the layer itself, its folders too
        and not (path.parent.name == "replica" and path.name in REPLICA_HTTP)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_check_sees_a_forbidden_import(tmp_path):
    """The check itself can fail: a router module importing the engine lazily is caught."""
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "bad.py").write_text(
        "def f():\n    from kvmesh.replica.engine.llm_engine import LLMEngine\n")
    assert _violations("router", tmp_path) == {"router/bad.py": ["kvmesh.replica.engine.llm_engine"]}


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_router_room_imports_only_the_rooms_below_it(room):
    assert _violations(room) == {}, f"{room}/ breaks the router's rooms (ARCHITECTURE.md)"


def test_the_room_check_sees_the_data_plane_reaching_into_control(tmp_path):
    """The check itself can fail: the proxy importing the runtime, or routing importing the door, is caught."""
    (tmp_path / "router" / "http").mkdir(parents=True)
    (tmp_path / "router" / "http" / "bad.py").write_text("from kvmesh.router.control.runtime import RouterRuntime\n")
    (tmp_path / "router" / "routing").mkdir()
    (tmp_path / "router" / "routing" / "bad.py").write_text(
        "import aiohttp\nfrom kvmesh.router.http.door import Door\n")
    assert _violations("router/http", tmp_path) == {"router/http/bad.py": ["kvmesh.router.control.runtime"]}
    assert _violations("router/routing", tmp_path) == {"router/routing/bad.py": ["aiohttp", "kvmesh.router.http.door"]}


def _runtime_imports(path: Path) -> set[str]:
    """``_imports`` less those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
                   for stmt in block.body for node in ast.walk(stmt)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("room", sorted(TYPE_ONLY))
def test_type_only_imports_stay_type_only(room):
    """A room's type-only doors (``TYPE_ONLY``) are never taken at run time."""
    offenders = {str(path.relative_to(ROOT)): sorted(n for n in _runtime_imports(path) if n.startswith(TYPE_ONLY[room]))
                 for path in sorted((ROOT / room).rglob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}
