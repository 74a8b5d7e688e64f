"""A large request body's decoded megabytes are handed back to the system soon after (replica/openai/heap_trim.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from kvmesh.replica.openai import heap_trim


def _rss_mb() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


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
        await asyncio.sleep(0.3)
        assert calls == [0]
        heap_trim.after_large_body(32 << 20, offload)  # a later one: its own trim
        await asyncio.sleep(0.3)
        assert calls == [0, 0]

    asyncio.run(main())


@pytest.mark.skipif(heap_trim.malloc_trim() is None, reason="this C library has no malloc_trim (not glibc)")
def test_the_trim_hands_back_what_a_thread_freed_and_malloc_kept():
    """Blocks freed on a worker thread stay in its arena (the small ones kept between them pin it); the trim gives
    their pages back."""
    kept = []

    def churn() -> None:
        big = []
        for _ in range(1200):  # 1,200 x 100 KB: under the mmap threshold, from the thread's arena
            big.append(b"x" * 100_000)
            kept.append(b"y" * 600)
        big.clear()

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    held = _rss_mb()
    heap_trim.malloc_trim()(0)
    assert _rss_mb() < held - 60, f"RSS {held:.0f} MB before the trim, {_rss_mb():.0f} MB after"
