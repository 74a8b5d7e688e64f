"""The grammar compile pool (engine/grammar_pool.py) on its own: tenants take turns, a compile nobody waits for any
more is dequeued or its process killed, and the pool's processes end with it."""

from __future__ import annotations

import pytest
from kvmesh.replica.engine.grammar_pool import GrammarPool
from kvmesh.replica.serving.grammar_config import StructuredOutputsConfig
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

from ..grammar_processes import compile_workers, wait_for
from .test_structured_outputs_engine import slow_choice

xgr = pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")


@pytest.fixture
def pool(stories_path):
    from transformers import AutoTokenizer

    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(stories_path), vocab_size=512)
    made = []

    def make(**config) -> GrammarPool:
        made.append(GrammarPool(info.serialize_json(), info, StructuredOutputsConfig(**config)))
        return made[-1]

    yield make
    for p in made:
        p.close()


def choice(tenant: str, i: int) -> StructuredOutputsParams:
    return StructuredOutputsParams(choice=(f"{tenant}-{i}", "x"), tenant=tenant)


def test_waiting_compiles_take_turns_by_tenant(pool):
    """One process; a heavy tenant queues six compiles, then a light one queues one: the light one is the second
    to compile, not the seventh."""
    p, order = pool(compile_processes=1), []
    jobs = [choice("heavy", i) for i in range(6)] + [choice("light", 0)]
    futures = []
    for so in jobs:
        future = p.submit(so.key, so, so.tenant, so.choice[0])
        future.add_done_callback(lambda f, name=so.choice[0]: order.append(name))  # on the dispatcher thread
        futures.append(future)
    for future in futures:
        assert future.exception(timeout=120) is None
    assert order[:3] == ["heavy-0", "light-0", "heavy-1"], order
    assert p.stats["compiled"] == 7 and p.stats["running"] == p.stats["waiting"] == 0


def test_a_compile_nobody_waits_for_is_dequeued_or_killed(pool):
    """A waiting compile whose request left is dequeued without compiling; a running one (a slow choice list) has
    its process killed and replaced; one a second request still waits for goes on."""
    p = pool(compile_processes=1, compile_timeout_s=60)
    slow, queued, shared = slow_choice(7, words=1000), choice("a", 1), choice("b", 2)
    running = p.submit(slow.key, slow, "a", "r1")
    waiting = p.submit(queued.key, queued, "a", "r2")
    both = [p.submit(shared.key, shared, "b", rid) for rid in ("r3", "r4")]
    assert both[0] is both[1]
    assert wait_for(lambda: p.stats["running"] == 1, 60)
    pids = p.worker_pids
    p.release(queued.key, "r2")
    assert waiting.cancelled() and p.stats["cancelled"] == 1
    p.release(shared.key, "r3")  # r4 still waits for it
    p.release(slow.key, "r1")
    assert wait_for(running.cancelled, 10)
    assert wait_for(lambda: p.worker_pids and p.worker_pids != pids, 30)  # replaced
    assert both[0].exception(timeout=60) is None
    assert (p.stats["cancelled"], p.stats["compiled"], p.stats["running"], p.stats["waiting"]) == (2, 1, 0, 0)


def test_closing_the_pool_ends_its_processes_and_its_compiles(pool):
    p = pool(compile_processes=2, compile_timeout_s=60)
    futures = [p.submit(so.key, so, "a", f"r{i}") for i, so in enumerate(slow_choice(i) for i in range(3))]
    assert wait_for(lambda: p.stats["running"] == 2, 60)
    pids = set(p.worker_pids)
    assert pids <= {w.pid for w in compile_workers()}
    p.close()
    assert all(f.done() for f in futures) and not p._thread.is_alive()
    assert wait_for(lambda: not pids & {w.pid for w in compile_workers()}, 5)


def test_compiles_submitted_from_many_threads_at_once_all_end(pool):
    """Hostile timing: eight threads submit 25 compiles each, one after another, while the dispatcher takes wakes.
    Every compile ends; none waits forever for a wake the dispatcher read and lost."""
    from concurrent.futures import ThreadPoolExecutor

    p = pool(compile_processes=2)

    def submit_all(thread: int) -> list:
        futures = []
        for i in range(25):
            so = choice(f"t{thread}", i)
            futures.append(p.submit(so.key, so, so.tenant, f"{thread}-{i}"))
        return futures

    with ThreadPoolExecutor(8) as threads:
        futures = [f for batch in threads.map(submit_all, range(8)) for f in batch]
    for future in futures:
        assert future.exception(timeout=120) is None
    assert p.stats["compiled"] == 200 and p.stats["running"] == p.stats["waiting"] == 0


def test_compile_processes_run_below_the_engines_priority(pool):
    """A flood of slow constraints keeps the compile processes busy and restarting: they run niced, so where CPUs
    are short the engine's steps come first (engine/grammar_worker.py's ``NICENESS``)."""
    import os

    import psutil

    ours = os.nice(0)
    if ours == 19:
        pytest.skip("this process runs at the lowest priority already: no lower one to see")
    p = pool(compile_processes=2, compile_timeout_s=60)
    p.warm()
    assert wait_for(lambda: len(p.worker_pids) == 2, 60)
    assert wait_for(lambda: all(psutil.Process(pid).nice() > ours for pid in p.worker_pids), 30), \
        (ours, [psutil.Process(pid).nice() for pid in p.worker_pids])
