"""The load of ``kvmesh bench fleet_quota``: a heavy tenant flooding N routers and a light tenant beside it.

    heavy   ``clients`` closed-loop clients spread over the routers, one key (its tenant); each request names
            another ``user`` (a tenant lying about who it is: the key decides), a 429 is retried after
            ``flood_pause_s`` whatever its Retry-After says (a flood). Served tokens: usage.prompt_tokens +
            usage.completion_tokens of each 200, at the moment it answered.
    warm    until the heavy tenant's first 429 (its burst spent), then ``settle_s``
    window  ``window_s`` seconds: the heavy tenant's served tokens / ``window_s`` is its rate
    light   one request every ``light_period_s`` through the routers in turn: its latency, alone and beside the flood
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.quota_fleet import LIGHT_KEY

PROMPT = "Once upon a time there was a little girl who liked to play in the park with her dog"


@dataclass(slots=True)
class LoadSettings:
    model: str
    heavy_key: str
    """The heavy tenant's API key."""
    clients: int = 8
    max_tokens: int = 8
    flood_pause_s: float = 0.1
    settle_s: float = 1.0
    window_s: float = 20.0
    light_period_s: float = 0.5
    warm_timeout_s: float = 60.0


@dataclass(slots=True)
class Tally:
    served: list[tuple[float, int]] = field(default_factory=list)
    """(when it answered, its tokens) of each heavy 200."""
    shed: int = 0
    errors: int = 0
    first_429: float | None = None
    light_s: list[float] = field(default_factory=list)
    light_errors: int = 0


async def _heavy(session: aiohttp.ClientSession, url: str, n: int, s: LoadSettings, t: Tally,
                 stop: list[float]) -> None:
    i = 0
    while time.monotonic() < stop[0]:
        i += 1
        body = {"model": s.model, "prompt": PROMPT, "max_tokens": s.max_tokens, "user": f"not-heavy-{n}-{i}"}
        try:
            async with session.post(url + "/v1/completions", json=body,
                                    headers={"Authorization": f"Bearer {s.heavy_key}"}) as r:
                answer = await r.json(content_type=None)
                if r.status == 200:
                    usage = answer["usage"]
                    t.served.append((time.monotonic(), usage["prompt_tokens"] + usage["completion_tokens"]))
                    continue
                if r.status == 429:
                    t.shed += 1
                    t.first_429 = t.first_429 or time.monotonic()
                else:
                    t.errors += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
            t.errors += 1
        await asyncio.sleep(s.flood_pause_s)


async def _light(session: aiohttp.ClientSession, urls: list[str], s: LoadSettings, t: Tally, stop: list[float]) -> None:
    n = 0
    while time.monotonic() < stop[0]:
        url, n = urls[n % len(urls)], n + 1
        t0 = time.perf_counter()
        body = {"model": s.model, "prompt": PROMPT, "max_tokens": 8}
        try:
            async with session.post(url + "/v1/completions", json=body,
                                    headers={"Authorization": f"Bearer {LIGHT_KEY}"}) as r:
                await r.read()
                if r.status == 200:
                    t.light_s.append(time.perf_counter() - t0)
                else:
                    t.light_errors += 1
        except (aiohttp.ClientError, asyncio.TimeoutError):
            t.light_errors += 1
        await asyncio.sleep(max(0.0, s.light_period_s - (time.perf_counter() - t0)))


async def light_alone(urls: list[str], s: LoadSettings, seconds: float) -> list[float]:
    """The light tenant's latencies with nothing else running."""
    t = Tally()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        await _light(session, urls, s, t, [time.monotonic() + seconds])
    return t.light_s


async def flood(urls: list[str], s: LoadSettings) -> dict:
    """The heavy tenant's flood over ``urls`` with the light tenant beside it (module doc): what was measured."""
    t, start = Tally(), time.monotonic()
    stop = [start + s.warm_timeout_s + s.settle_s + s.window_s]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(_heavy(session, urls[n % len(urls)], n, s, t, stop)) for n in range(s.clients)]
        while t.first_429 is None and time.monotonic() < start + s.warm_timeout_s:
            await asyncio.sleep(0.05)
        if t.first_429 is None:
            raise RuntimeError(f"the heavy tenant was never refused in {s.warm_timeout_s:.0f} s: no limit in force")
        w0 = time.monotonic() + s.settle_s
        stop[0] = w0 + s.window_s  # every client ends at the window's end
        light_t = Tally()
        await asyncio.sleep(s.settle_s)
        await asyncio.gather(_light(session, urls, s, light_t, stop), *tasks)
    window = [n for at, n in t.served if w0 <= at < w0 + s.window_s]
    return {"routers": len(urls), "rate_tokens_per_s": sum(window) / s.window_s, "window_s": s.window_s,
            "from_start_tokens_per_s": sum(n for at, n in t.served if at < w0 + s.window_s) / (w0 + s.window_s - start),
            "burst_spent_after_s": t.first_429 - start, "served_requests": len(window), "shed_429": t.shed,
            "errors": t.errors, "light": light_t.light_s, "light_errors": light_t.light_errors}
