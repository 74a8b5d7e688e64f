"""A large request body's decoded megabytes are handed back to the system soon after (replica/openai/heap_trim.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from kvmesh.replica.openai import heap_trim


def test_a_large_body_asks_for_one_trim_soon_and_a_small_one_for_none(monkeypatch):
    calls = []
    monkeypatch.setattr(heap_trim, "malloc_trim", lambda: calls.append)
    monkeypatch.setattr(heap_trim, "TRIM_DELAY_S", 0.05)
    monkeypatch.setattr(heap_trim, "_next_trim", 0.0)
    monkeypatch.setattr(heap_trim, "_last_large", 0.0)

    async def offload(fn, *args):  # what PromptRenderer.run does: fn(*args) on a render thread
        return await asyncio.to_thread(fn, *args)

    async def main() -> None:
        heap_trim.after_large_body(heap_trim.TRIM_AFTER_BYTES - 1, offload)
        await asyncio.sleep(0.3)
        assert calls == []
        for _ in range(5):  # bodies arriving one after another: one trim once they stop
            heap_trim.after_large_body(heap_trim.TRIM_AFTER_BYTES, offload)
            await asyncio.sleep(0.03)
        assert calls == []
        await _until(lambda: calls == [0])  # its collection first: a while on a busy machine
        assert calls == [0]
        heap_trim.after_large_body(32 << 20, offload)  # a later one: its own trim
        await _until(lambda: calls == [0, 0])
        assert calls == [0, 0]

    asyncio.run(main())


async def _until(condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)


class _Failed:
    """What a failed request leaves: a large value in a reference cycle (its exception, traceback and future)."""

    def __init__(self) -> None:
        self.body = [{"role": "user", "content": str(i)} for i in range(100_000)]
        self.cycle = self


def test_the_cyclic_garbage_a_failed_request_left_is_freed_with_the_trim(monkeypatch):
    import gc
    import weakref

    monkeypatch.setattr(heap_trim, "malloc_trim", lambda: (lambda pad: 0))
    monkeypatch.setattr(heap_trim, "TRIM_DELAY_S", 0.05)
    monkeypatch.setattr(heap_trim, "_next_trim", 0.0)
    monkeypatch.setattr(heap_trim, "_last_large", 0.0)

    async def main() -> weakref.ref:
        left = weakref.ref(_Failed())  # garbage now, freed only by a collection
        heap_trim.after_large_body(heap_trim.TRIM_AFTER_BYTES, lambda fn, *args: asyncio.to_thread(fn, *args))
        await _until(lambda: left() is None)
        return left

    gc.disable()  # no collection but the trim's (the router's young collections wait for 10,000 new objects)
    try:
        assert asyncio.run(main())() is None
    finally:
        gc.enable()


_CHURN = """
import threading
from pathlib import Path
from kvmesh.replica.openai import heap_trim

def rss_mb():
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024

kept = []
def churn():
    big = []
    for _ in range(1200):  # 1,200 x 100 KB: under the mmap threshold, from the thread's arena
        big.append(b"x" * 100_000)
        kept.append(b"y" * 600)  # the small blocks between them pin the arena
    big.clear()

worker = threading.Thread(target=churn)
worker.start()
worker.join()
held = rss_mb()
heap_trim.malloc_trim()(0)
print(held, rss_mb())
"""


@pytest.mark.skipif(heap_trim.malloc_trim() is None, reason="this C library has no malloc_trim (not glibc)")
def test_the_trim_hands_back_what_a_thread_freed_and_malloc_kept():
    """Blocks freed on a worker thread stay in its arena; the trim gives their pages back (in a fresh process: this
    one's arenas hold whatever earlier tests left)."""
    out = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True, timeout=60, check=True)
    held, after = map(float, out.stdout.split())
    assert after < held - 60, f"RSS {held:.0f} MB before the trim, {after:.0f} MB after"
