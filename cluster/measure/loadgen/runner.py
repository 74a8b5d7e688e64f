"""Sends a workload: open loop (Poisson arrivals or trace timestamps) or closed loop (fixed concurrency).

Open loop starts each session at its arrival time whether or not earlier ones finished (what
users do); closed loop keeps ``concurrency`` sessions in flight (what a saturation test does).
The turns of one session are always sequential, ``think_time`` apart (``options.LoadOptions``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import aiohttp
from kvmesh.cluster.measure.loadgen.client import RequestResult, send_streaming
from kvmesh.cluster.measure.loadgen.options import LoadOptions, WorkloadOptions
from kvmesh.cluster.measure.loadgen.session import RequestOptions, SessionState
from kvmesh.cluster.measure.workloads.prompts import PromptMaker
from kvmesh.cluster.measure.workloads.sessions import Session


def arrival_times(sessions: list[Session], load: LoadOptions, seed: int) -> list[float]:
    """Open-loop start times: Poisson at ``rate`` (``seed``), else the sessions' own timestamps."""
    if load.rate is not None:
        rng = random.Random(seed)
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
                   maker: PromptMaker, load: LoadOptions, workload: WorkloadOptions,
                   on_result: Callable[[RequestResult], None] | None = None) -> tuple[list[RequestResult], float, dict]:
    """Send every session; returns (results, wall seconds, counters)."""
    results: list[RequestResult] = []
    counters = {"sessions": len(sessions), "sessions_truncated": 0, "turns_skipped_by_duration": 0}
    concurrency = load.resolved_concurrency
    limit = asyncio.Semaphore(concurrency) if load.mode == "open" and concurrency else None
    t0 = time.perf_counter()

    def expired() -> bool:
        return load.duration is not None and time.perf_counter() - t0 >= load.duration

    async def one_session(session: Session) -> None:
        state = SessionState(session, options, maker, workload.max_prompt_tokens)
        for k in range(len(session.turns)):
            if not state.fits(k):
                counters["sessions_truncated"] += 1
                return
            if k and load.think_time:
                await asyncio.sleep(load.think_time)
            if expired():
                counters["turns_skipped_by_duration"] += len(session.turns) - k
                return
            path, body = state.body(k)
            result = RequestResult(session.session_id, k, model=body["model"])
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

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(sessions)))))
        counters["turns_skipped_by_duration"] += sum(len(s.turns) for s in queue)
    else:
        starts = arrival_times(sessions, load, workload.seed)

        async def delayed(session: Session, at: float) -> None:
            delay = at - (time.perf_counter() - t0)
            if load.duration is not None and at >= load.duration:
                counters["turns_skipped_by_duration"] += len(session.turns)
                return
            if delay > 0:
                await asyncio.sleep(delay)
            await one_session(session)

        await asyncio.gather(*(delayed(s, at) for s, at in zip(sessions, starts, strict=True)))
    return results, time.perf_counter() - t0, counters
