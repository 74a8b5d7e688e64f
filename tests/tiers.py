"""The test tiers: which tests start Ray or a live server, marked at collection, and a guard that catches the rest.

    make test         the whole suite (what CI runs)
    make test-quick   -m "not ray and not live and not slow": no Ray, no server on a port, nothing slow

A test is marked ``ray`` when it (or a fixture it uses, at any depth) uses the session's Ray instance
(``ray_session``); ``live`` when its module or a fixture it uses starts a server: a replica or router on a port (in
this process or another), a fake replica process, ``kvmesh serve`` (``LIVE_STARTERS``, read in the source at
collection); ``slow`` when it runs the real model or the whole trace (``SLOW_FIXTURES``) or Triton kernels
(``INTERPRETED_KERNELS``), or is listed: a file whose every test is one of those (``SLOW_FILES``), a test measured
at more than half a CPU second in a run of the quick tier (``MEASURED_SLOW``: tests/cpu_seconds.py measures and
writes tests/slow_tests.json) or named with a reason (``SLOW_TESTS``). So no test
file needs a marker of its own for these; other slow ones say ``slow``. The quick tier is for the inner loop: under
3 minutes of CPU for all of it, whatever else the machine runs; ``make test`` runs every test of every tier.

Collecting costs the quick tier as much as running its tests (every test process imports every test module): a
file whose every test it would deselect, known from the source alone, is skipped unimported
(``ignore_outside_quick_tier``).

What reading source misses, the guard catches when the test runs: a test marked neither ``ray`` nor ``live`` that
listens on a socket, starts a kvmesh server process or starts Ray fails, saying which marker it needs.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
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

SLOW_FILES = frozenset({
    "cluster/test_peft_writer.py",
    "kvcache/test_trace_replay.py",
    "loadgen/test_router_parse.py",
    "replica/test_cuda_graph_engine.py",
    "replica/test_engine_host_tier.py",
    "replica/test_engine_persistent_batch.py",
    "replica/test_engine_real_runner.py",
    "replica/test_grammar_pool.py",
    "replica/test_kv_pull_overlap.py",
    "replica/test_llm_generate.py",
    "replica/test_logprobs_hf.py",
    "replica/test_lora_identity.py",
    "replica/test_lora_step_time.py",
    "replica/test_lora_versions.py",
    "replica/test_model_runner.py",
    "replica/test_output_text_rules.py",
    "replica/test_prefix_pull.py",
    "replica/test_prompt_chars.py",
    "replica/test_renderer_inline.py",
    "replica/test_spec_decode_greedy.py",
    "replica/test_spec_decode_pd.py",
    "replica/test_spec_decode_sampled.py",
    "replica/test_step_transfers.py",
    "replica/test_structured_outputs_reasoning.py",
    "replica/test_tokenizer.py",
    "router/test_id_prompt_fast_decode.py",
    "router/test_request_reader.py",
    "sim/test_acceptance_full_trace.py",
    "sim/test_policy_comparison.py",
    "test_readme_agent_loop.py",
    "test_responses_agents.py",
    "test_responses_live.py",
    "test_responses_workers.py",
})
"""Test files (under tests/) whose every test already runs the real model or the whole trace, or starts a server,
through its fixtures: slow as a whole, so that ``make test-quick`` skips them unimported (they import peft,
transformers, openai: most of what collecting them cost). A fast test belongs in another file."""

SLOW_TESTS = {
    "test_docs_commands.py::test_run_commands":
        "each runs a guide's command in a process of its own (kvmesh sim, bench): 1-20 CPU seconds, 54 for all 7",
    "router/test_load_feed_flood.py::test_a_flood_costs_the_loop_little_and_the_honest_replicas_are_followed_as_"
    "before": "floods a subscriber for seconds and times the honest replica's updates against the wall clock",
}
"""Tests (under tests/, up to the parameters) that cost the quick tier more than about a CPU second each, and why;
``python tests/cpu_seconds.py DIR`` names the costliest of a run (``KVMESH_TEST_CPU_DIR=DIR make test-quick``)."""

_SERVING = ("serve", "replica", "router")
"""kvmesh commands that serve until stopped."""


@functools.cache
def _source(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


TIER_MARKS = frozenset({"ray", "live", "slow"})
"""The marks the quick tier leaves out."""


def _module_marks(source: str) -> set[str]:
    """The marks a module's ``pytestmark`` gives every test in it (``pytest.mark.X`` alone or in a list)."""
    if "pytestmark" not in source:
        return set()
    marks: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            marks |= {v.attr for v in values if isinstance(v, ast.Attribute) and ast.unparse(v.value) == "pytest.mark"}
    return marks


def outside_quick_tier(path: Path) -> bool:
    """Every test of this file is marked ``ray``, ``live`` or ``slow``, as read from its source alone: it starts a
    server or runs Triton kernels (``mark_tiers`` marks each test of such a file), or its ``pytestmark`` names one of
    those marks. ``make test-quick`` then skips the file without importing it (conftest.py,
    ``pytest_ignore_collect``): importing the modules it would deselect anyway was half of its collection's CPU."""
    if path.is_relative_to(TESTS) and path.relative_to(TESTS).as_posix() in SLOW_FILES:
        return True
    source = _source(str(path))
    return bool(LIVE_STARTERS.search(source) or INTERPRETED_KERNELS.search(source)
                or _module_marks(source) & TIER_MARKS)


def ignore_outside_quick_tier(collection_path: Path, config: pytest.Config) -> bool | None:
    """``pytest_ignore_collect`` (conftest.py): under ``-m "QUICK_EXPRESSION"``, True for a test file that
    ``outside_quick_tier``; None otherwise, so that pytest's own rules decide."""
    quick = " ".join((config.getoption("markexpr") or "").split()) == QUICK_EXPRESSION
    if quick and collection_path.name.startswith("test_") and collection_path.suffix == ".py" \
            and outside_quick_tier(collection_path):
        return True
    return None


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


_MEASURED = Path(__file__).with_name("slow_tests.json")
MEASURED_SLOW = frozenset(json.loads(_MEASURED.read_text()) if _MEASURED.exists() else ())
"""Tests measured at more than ``SLOW_CPU_S`` CPU seconds in a run of the quick tier (tests/slow_tests.json, written
by ``python tests/cpu_seconds.py DIR --write`` from ``KVMESH_TEST_CPU_DIR=DIR make test-quick``)."""


def _listed_slow(item: pytest.Item) -> bool:
    test = item.nodeid.split("[", 1)[0].removeprefix("tests/")
    return test.split("::", 1)[0] in SLOW_FILES or test in SLOW_TESTS or item.nodeid in MEASURED_SLOW


def mark_tiers(items: list[pytest.Item]) -> None:
    """Add ``ray``, ``live`` and ``slow`` where a test needs them (see the module doc)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        source = _source(str(item.path))
        if "ray_session" in fixtures and "ray" not in item.keywords:
            item.add_marker(pytest.mark.ray)
        if "slow" not in item.keywords and (fixtures & SLOW_FIXTURES or INTERPRETED_KERNELS.search(source)
                                            or _listed_slow(item)):
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
