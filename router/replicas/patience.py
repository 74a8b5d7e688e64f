"""How long the router waits for one replica's answer: its first bytes, then each next bytes of a stream.

    patience = Patience(first_byte_s=20, idle_s=20, progressed_since=...)
    response = await pool.post(url, path, body, headers, patience)   # DeadlineMissed when it runs out

The first-byte wait is extended, period by period, while ``progressed_since(start of the period)`` says the
replica is working (router/routing/outlier.py: bytes of its other answers, its ``/load`` prefill queue
shrinking, its KV events moving), up to the pool's ``read_timeout_s`` in all: a slow replica is waited for, a
silent one costs one period. A stream that goes ``idle_s`` without a byte misses its deadline at once (the
relay moves it to another replica); ``DeadlineMissed.progressed`` says whether its replica was working
meanwhile, which decides whether the miss counts against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Patience:
    """The deadlines of one replica's answers (``RouterConfig.upstream``: ``first_byte_timeout_s``,
    ``stream_idle_timeout_s``)."""

    first_byte_s: float | None
    """Seconds to wait for the first body bytes, per period without progress; None: no such deadline."""
    idle_s: float | None
    """Seconds a started answer may go without bytes; None: no such deadline."""
    progressed_since: Callable[[float], bool]
    """Whether the replica showed progress after a ``time.monotonic()`` instant."""
