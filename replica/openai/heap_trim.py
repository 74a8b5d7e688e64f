"""Handing the heap a large request body left behind back to the system.

A request that fails keeps what it decoded alive after it ends: its exception's traceback holds the frames that
decoded, rendered and tokenized the body (their ``raw``, ``body`` and request locals), and the asyncio future that
carried the exception off the render thread is one of those frames' locals, a cycle only the garbage collector
breaks. The router's young generation waits for 10,000 net new objects (router_server.py), so after an attack the
last few large bodies' millions of objects stayed for as long as the process idled (30 MB and more after four
100,000-message chats). ``after_large_body`` therefore first runs a full collection, then the trim.

glibc's malloc keeps what a thread frees in that thread's arena, and after a large block is freed it raises its mmap
threshold (up to 32 MiB), so the next bodies of that size come from the heap too: the megabytes a large body was read
and decoded into stay resident after its request ends. A tenant sending 30 MB bodies, decoded on the render threads,
left a replica 80-150 MB larger for good. ``after_large_body`` asks for one ``gc.collect()`` and one
``malloc_trim(0)`` (every arena) a moment after bodies of ``TRIM_AFTER_BYTES`` or more stop arriving
(``TRIM_DELAY_S`` without one), on the render threads; where the C library has no ``malloc_trim`` (musl, macOS) it
only collects.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import threading
import time
from collections.abc import Awaitable, Callable

from kvmesh.replica.serving.errors import ProtocolError

TRIM_AFTER_BYTES = 1 << 20
"""Bodies this large (or larger) ask for a trim; smaller ones come from memory that is reused at once."""
TRIM_DELAY_S = 2.0
"""Seconds after such a body before the trim (its request has usually ended and freed what it decoded)."""

_lock = threading.Lock()
_next_trim = 0.0
"""When the trim asked for last runs (``time.monotonic``): a body before then is covered by it."""
_last_large = 0.0
"""When the last large body arrived: the trim waits until ``TRIM_DELAY_S`` have passed without one."""
_running: set[asyncio.Task] = set()


@functools.cache
def malloc_trim() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim``, or None where it has none."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def after_large_body(size: int, offload: Callable[..., Awaitable[object]]) -> None:
    """A body of ``size`` bytes was read on the running loop: if it was large, trim the heap soon through ``offload``
    (``PromptRenderer.run``: the render threads, which the large body started anyway; module doc)."""
    global _next_trim, _last_large
    if size < TRIM_AFTER_BYTES:
        return
    with _lock:
        _last_large = now = time.monotonic()
        if now < _next_trim:
            return
        _next_trim = now + TRIM_DELAY_S
    loop = asyncio.get_running_loop()
    loop.call_later(TRIM_DELAY_S, _start, loop, offload)


def _start(loop: asyncio.AbstractEventLoop, offload: Callable[..., Awaitable[object]]) -> None:
    """Trim, or wait on while large bodies keep coming (none during an attack: the trim holds malloc's locks)."""
    global _next_trim
    with _lock:
        wait = _last_large + TRIM_DELAY_S - time.monotonic()
        if wait > 0:
            _next_trim = time.monotonic() + wait
    if wait > 0:
        loop.call_later(wait, _start, loop, offload)
        return
    task = loop.create_task(_trim(offload))
    _running.add(task)  # held until it ends (the loop keeps only a weak reference)
    task.add_done_callback(_running.discard)


async def _trim(offload: Callable[..., Awaitable[object]]) -> None:
    with contextlib.suppress(ProtocolError):  # the pool busier than render_timeout_s: the next large body trims
        await offload(release)


def release() -> None:
    """Free the cyclic garbage failed requests left (module doc), then hand the heap's free pages back."""
    gc.collect()
    trim = malloc_trim()
    if trim is not None:
        trim(0)
