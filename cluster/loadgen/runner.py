"""Sends a workload: open loop (Poisson arrivals or trace timestamps) or closed loop (fixed concurrency).

Open loop starts each session at its arrival time whether or not earlier ones finished (what
users do); closed loop keeps ``concurrency`` sessions in flight (what a saturation test does).
The turns of one session are always sequential, ``think_time_s`` apart.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from kvmesh.cluster.loadgen.client import RequestResult, send_streaming
from kvmesh.cluster.loadgen.prompts import PromptMaker
from kvmesh.cluster.loadgen.session import RequestOptions, SessionState
from kvmesh.cluster.loadgen.workloads import Session


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """How the sessions are sent."""

    mode: str = "closed"
    """``open`` (arrivals) or ``closed`` (fixed concurrency)."""
    rate: float | None = None
    """Open loop: sessions per second (Poisson). None: the sessions' trace timestamps."""
    concurrency: int = 8
    """Closed loop: sessions in flight; open loop: cap on requests in flight (0 = none)."""
    think_time_s: float = 0.0
    """Pause between the turns of a session."""
    max_prompt_tokens: int = 384
    """Multi-turn sessions stop before exceeding this."""
    seed: int = 0
    """Poisson arrival seed."""
    duration_s: float | None = None
    """Send no new request after this many seconds (in-flight ones finish); None: until the workload ends."""

    def __post_init__(self) -> None:
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration must be > 0 seconds, got {self.duration_s}")
        if self.mode not in ("open", "closed"):
            raise ValueError(f"mode must be 'open' or 'closed', got {self.mode!r}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.concurrency < 0 or (self.mode == "closed" and self.concurrency < 1):
            raise ValueError(f"concurrency must be >= 1 in closed loop, got {self.concurrency}")


def arrival_times(sessions: list[Session], load: LoadConfig) -> list[float]:
    """Open-loop start times: Poisson at ``rate``, else the sessions' own timestamps."""
    if load.rate is not None:
        rng = random.Random(load.seed)
        t, out = 0.0, []
        for _ in sessions:
            out.append(t)
            t += rng.expovariate(load.rate)
        return out
    missing = [s.session_id for s in sessions if s.arrival_s is None]
    if missing:
        raise ValueError(f"open loop needs --rate for workloads without timestamps (e.g. {missing[0]})")
    return [s.arrival_s for s in sessions]


async def run_load(client: aiohttp.ClientSession, sessions: list[Session], options: RequestOptions,
                   maker: PromptMaker, load: LoadConfig,
                   on_result: Callable[[RequestResult], None] | None = None) -> tuple[list[RequestResult], float, dict]:
    """Send every session; returns (results, wall seconds, counters)."""
    results: list[RequestResult] = []
    counters = {"sessions": len(sessions), "sessions_truncated": 0, "turns_skipped_by_duration": 0}
    limit = asyncio.Semaphore(load.concurrency) if load.mode == "open" and load.concurrency else None
    t0 = time.perf_counter()

    def expired() -> bool:
        return load.duration_s is not None and time.perf_counter() - t0 >= load.duration_s

    async def one_session(session: Session) -> None:
        state = SessionState(session, options, maker, load.max_prompt_tokens)
        for k in range(len(session.turns)):
            if not state.fits(k):
                counters["sessions_truncated"] += 1
                return
            if k and load.think_time_s:
                await asyncio.sleep(load.think_time_s)
            if expired():
                counters["turns_skipped_by_duration"] += len(session.turns) - k
                return
            path, body = state.body(k)
            result = RequestResult(session.session_id, k)
            if limit is not None:
                async with limit:
                    await send_streaming(client, path, body, result, t0)
            else:
                await send_streaming(client, path, body, result, t0)
            results.append(result)
            if on_result is not None:
                on_result(result)
            if not result.ok:
                return  # a failed turn ends its conversation
            state.record(k, body, result.text, result.prompt_tokens, result.completion_tokens)

    if load.mode == "closed":
        queue = list(reversed(sessions))

        async def worker() -> None:
            while queue and not expired():
                await one_session(queue.pop())

        await asyncio.gather(*(worker() for _ in range(min(load.concurrency, len(sessions)))))
        counters["turns_skipped_by_duration"] += sum(len(s.turns) for s in queue)
    else:
        starts = arrival_times(sessions, load)

        async def delayed(session: Session, at: float) -> None:
            delay = at - (time.perf_counter() - t0)
            if load.duration_s is not None and at >= load.duration_s:
                counters["turns_skipped_by_duration"] += len(session.turns)
                return
            if delay > 0:
                await asyncio.sleep(delay)
            await one_session(session)

        await asyncio.gather(*(delayed(s, at) for s, at in zip(sessions, starts, strict=True)))
    return results, time.perf_counter() - t0, counters
