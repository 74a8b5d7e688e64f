"""Clients spread over several routers: each request goes to one router; a client whose router refuses the
connection (or drops it before an answer) moves on to the next router and sends it again there.

Each answer is kept with the router that gave it, so a run can say how many requests failed *through* each router
and how long a refused connection took to fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from kvmesh.router.routing.receipts import receipt_headers

REQUEST_TIMEOUT_S = 60.0
"""Longest wait for one completion."""


@dataclass(slots=True)
class Outcome:
    """One request as its client saw it."""

    router: int
    """The router that answered (or failed last)."""
    status: int | None
    """HTTP status of the answer; None: no answer (connection refused or dropped)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    moved_from: list[int] | None = None
    """Routers this request failed on before ``router`` (connection refused or dropped), in order."""
    failed_fast_s: list[float] | None = None
    """Seconds each of those failures took."""
    error: str | None = None
    receipt: dict[str, str] | None = None
    """The route receipt's headers (``x-kvmesh-*``), when the request asked for them."""

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]
    max_tokens: int
    router: int
    """The router its client sends it to first."""


async def _complete(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict, dict[str, str]]:
    async with http.post(url + "/v1/completions", json=body) as response:
        return response.status, await response.json(content_type=None), receipt_headers(response.headers)


async def send(http: aiohttp.ClientSession, urls: Callable[[], list[str]], request: Request, salt: str,
               model: str) -> Outcome:
    """One request, moving on over the routers while a connection is refused or dropped (each router once)."""
    moved, fast = [], []
    body = {"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens, "temperature": 0.0,
            "cache_salt": salt}
    where = urls()
    for step in range(len(where)):
        router = (request.router + step) % len(where)
        started = time.monotonic()
        try:
            status, answer, receipt = await _complete(http, where[router], body)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            moved.append(router)
            fast.append(time.monotonic() - started)
            last_error = type(e).__name__
            continue
        usage = answer.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        error = None if status == 200 else str((answer.get("error") or {}).get("message"))[:300]
        return Outcome(router, status, usage.get("prompt_tokens", 0), cached, moved or None, fast or None, error,
                       receipt or None)
    return Outcome(moved[-1], None, moved_from=moved, failed_fast_s=fast, error=last_error)


async def replay(urls: Callable[[], list[str]], requests: list[Request], salt: str, model: str, concurrency: int,
                 headers: dict[str, str], on_sent: Callable[[int], None] | None = None) -> list[Outcome]:
    """Every request, ``concurrency`` at a time in order, each with ``headers`` (the API key); ``on_sent(i)`` is
    called as request i is handed out."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    outcomes: list[Outcome | None] = [None] * len(requests)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)

    async def client(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            if on_sent is not None:
                on_sent(i)
            outcomes[i] = await send(http, urls, requests[i], salt, model)

    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return [o for o in outcomes if o is not None]


def hit_rate(outcomes: list[Outcome]) -> float:
    """Cached prompt tokens over prompt tokens of the answered requests (0..1)."""
    ok = [o for o in outcomes if o.ok]
    prompt = sum(o.prompt_tokens for o in ok)
    return sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0
