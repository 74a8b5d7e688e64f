"""The test tiers: which tests start Ray or a live server, marked at collection, and a guard that catches the rest.

    make test         the whole suite (what CI runs)
    make test-quick   -m "not ray and not live and not slow": no Ray, no server on a port, nothing slow

A test is marked ``ray`` when it (or a fixture it uses, at any depth) uses the session's Ray instance
(``ray_session``); ``live`` when its module or a fixture it uses starts a server: a replica or router on a port (in
this process or another), a fake replica process, ``kvmesh serve`` (``LIVE_STARTERS``, read in the source at
collection); ``slow`` when it runs the real model or the whole trace (``SLOW_FIXTURES``) or Triton kernels
(``INTERPRETED_KERNELS``). So no test file needs a marker of its own for these; other slow ones say ``slow``.

What reading source misses, the guard catches when the test runs: a test marked neither ``ray`` nor ``live`` that
listens on a socket, starts a kvmesh server process or starts Ray fails, saying which marker it needs.
"""

from __future__ import annotations

import functools
import inspect
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

QUICK_EXPRESSION = "not ray and not live and not slow"
"""``make test-quick``'s ``-m``: the inner loop's tier."""

LIVE_STARTERS = re.compile(
    r"ReplicaRuntime\.start|RouterServer\(|RouterWorkers|stories_replica\(|kv_replica\(|launched_fakes\(|FakeProc\(|"
    r"stub_replica\(|serve_in_thread|_command\.start\(|HTTPServer\(|\.listen\(|start_server\(|\bstart_router\b|openai_pair|"
    r"fake_server\b|fake_json_server|EndlessMessagePeer|\bListener\(|TCPSite\(|Popen\(|"
    r"[\"']kvmesh[\"'],\s*[\"'](?:serve|replica|router)[\"']")
"""Source text that starts a server (helpers of this suite and of cluster/measure/benchmarks/support/)."""

SLOW_FIXTURES = frozenset({"stories_path", "mooncake_trace"})
"""Fixtures whose tests take seconds each: a real model through the engine, the whole Mooncake trace."""
INTERPRETED_KERNELS = re.compile(r"triton_problem\(|\btriton_device\b")
"""Source text of a module that runs Triton kernels (through the interpreter without a GPU: seconds each)."""

_SERVING = ("serve", "replica", "router")
"""kvmesh commands that serve until stopped."""


@functools.cache
def _source(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _fixture_sources(item: pytest.Item):
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        for fixturedef in defs:
            if fixturedef.argname != "tier_guard":  # its own source names what it watches for
                yield fixturedef.func


@functools.cache
def _fixture_starts_server(func) -> bool:
    """Read once per fixture function: ``inspect.getsource`` costs milliseconds and a suite asks tens of thousands
    of times (each test, each fixture it uses)."""
    try:
        return LIVE_STARTERS.search(inspect.getsource(func)) is not None
    except (OSError, TypeError):
        return False


def mark_tiers(items: list[pytest.Item]) -> None:
    """Add ``ray``, ``live`` and ``slow`` where a test needs them (see the module doc)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        source = _source(str(item.path))
        if "ray_session" in fixtures and "ray" not in item.keywords:
            item.add_marker(pytest.mark.ray)
        if "slow" not in item.keywords and (fixtures & SLOW_FIXTURES or INTERPRETED_KERNELS.search(source)):
            item.add_marker(pytest.mark.slow)
        if "live" in item.keywords:
            continue
        if LIVE_STARTERS.search(source) or any(_fixture_starts_server(f) for f in _fixture_sources(item)):
            item.add_marker(pytest.mark.live)


class TierGuard:
    """What an unmarked test did that its tier forbids (a socket listening, a server process, Ray started)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def listen(self, original):
        guard = self

        def listen(sock, *args):
            if sock.family in (socket.AF_INET, socket.AF_INET6):  # a Unix socket (a fork server's) is no port
                guard.seen.append(f"listens on {sock.getsockname()} (a server on a port: mark it live)")
            return original(sock, *args)

        return listen

    def popen(self, original):
        guard = self

        def init(proc, args, *rest, **kw):
            caller = sys._getframe(1)
            if caller.f_globals.get("__name__") != "subprocess":  # run(), check_output(): it ends before they return
                argv = [str(a) for a in (args if isinstance(args, (list, tuple)) else str(args).split())]
                if any("kvmesh" in a for a in argv[:3]) and any(a in _SERVING or a.endswith(".fake_replica")
                                                                for a in argv):
                    guard.seen.append(f"starts {' '.join(argv)[:120]!r} (a server process: mark it live)")
            return original(proc, args, *rest, **kw)

        return init


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(getattr(ray, "is_initialized", lambda: False)())


@pytest.fixture(autouse=True)
def tier_guard(request):
    """Fails a test marked neither ``ray`` nor ``live`` that starts a server or Ray (see the module doc)."""
    keywords = request.node.keywords
    if "ray" in keywords or "live" in keywords:
        yield None
        return
    guard = TierGuard()
    ray_before = _ray_initialized()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "listen", guard.listen(socket.socket.listen))
        patch.setattr(subprocess.Popen, "__init__", guard.popen(subprocess.Popen.__init__))
        yield guard
    if not ray_before and _ray_initialized():
        guard.seen.append("starts Ray (mark it ray, or use the ray_session fixture)")
    if guard.seen:
        pytest.fail(f"{request.node.nodeid} is in the quick tier ({QUICK_EXPRESSION}) but "
                    + "; ".join(dict.fromkeys(guard.seen)), pytrace=False)
