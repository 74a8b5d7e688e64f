"""Turns to decide in, for the routers of one service that sync (router_sync.py).

Routers that tell each other their choices still decide blind of a choice made less than the stream's lag before
theirs: a burst that reaches every router at one instant is decided by all of them on the same view. Taking turns
closes that: time is cut into turns of ``turn_s`` seconds on the hosts' clocks, and router k of n (its rank among the
service's routers, every router ranking the same endpoints alike) decides only in the turns numbered k mod n. A
request waits for its router's next turn; every router's choices of one turn reach the next router before its turn
starts, as long as the lag is shorter than a turn. A router alone, or with turns off, decides at once.

The cost: a request waits up to n turns, n x ``turn_s`` / 2 on average (3 ms with four routers of 1.5 ms turns).
Clocks off by more than a turn make two routers' turns overlap: those decide blind of each other, as without turns.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.router.config import SyncConfig

__all__ = ["TakingTurns", "turn_wait_s"]


def turn_wait_s(now: float, turn_s: float, rank: int, routers: int, grace_s: float = 0.0) -> float:
    """Seconds from ``now`` until router ``rank`` of ``routers`` may decide: 0 within the first ``grace_s`` of one of
    its turns (or with one router, or ``turn_s`` 0), else until the start of its next one."""
    if routers < 2 or turn_s <= 0:
        return 0.0
    current = math.floor(now / turn_s)
    if current % routers == rank and now - current * turn_s <= grace_s:
        return 0.0
    first = math.ceil(now / turn_s - 1e-9)
    return max(0.0, (first + (rank - first) % routers) * turn_s - now)


class TakingTurns:
    """``RouterSync``'s turns (router_sync.py): its endpoint and followed peers rank it; it counts the waits."""

    config: SyncConfig
    endpoint: str | None
    _wanted: tuple[str, ...]
    turn_waits: int
    turn_wait_seconds: float

    def turn_wait(self, now: float | None = None) -> float:
        """Seconds a request that reached this router at ``now`` (the wall clock, which the routers' hosts share)
        waits for its turn to decide (``turn_wait_s``: its rank among its own and the followed endpoints, in their
        order; within the first half of its turn it goes at once). 0 without turns, peers or a bound endpoint."""
        me, wanted, turn_s = self.endpoint, self._wanted, self.config.turn_s
        if me is None or not wanted or turn_s <= 0:
            return 0.0
        ring = sorted({me, *wanted})
        return turn_wait_s(time.time() if now is None else now, turn_s, ring.index(me), len(ring), turn_s / 2)

    async def take_turn(self) -> None:
        """Wait for this router's turn to decide (``turn_wait``), counted; a timer that fires early (the event loop's
        are to the millisecond) waits again for the rest, so the decision is not made in another router's turn."""
        wait = self.turn_wait()
        if wait <= 0:
            return
        self.turn_waits += 1
        self.turn_wait_seconds += wait
        start = time.time() + wait
        while (left := start - time.time()) > 0:
            await asyncio.sleep(left)
