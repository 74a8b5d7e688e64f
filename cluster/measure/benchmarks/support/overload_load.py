"""The client half of ``kvmesh bench overload``: tenants' streaming requests and the three load shapes.

Every request is a streamed completion with ``ignore_eos`` (so it produces exactly ``max_tokens``), named by its
tenant (the request's ``user`` field, plus a Bearer key when one is configured for that tenant) and optionally
carrying a ``priority`` (the body field, vLLM's, lower first; or a header, or both). Its record (see
support/overload_report.py) is appended to ``Driver.records`` however it ends -- cancelled ones included -- so an
interrupted run still accounts for every request it sent. Every loop here is bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

STORY = ("there was a little girl named Lily. She loved to play in the park with her big red ball. One day, she "
         "saw a dog in the park and the dog wanted to play with the ball too.")


@dataclass(frozen=True, slots=True)
class LoadTenant:
    user: str
    """The request's ``user`` field (the tenant's name to a router without keys)."""
    api_key: str | None = None
    """A Bearer key naming the tenant to a router with a keys file; None: no Authorization header."""


@dataclass(slots=True)
class Driver:
    url: str
    client_timeout_s: float
    priority_in: str = "body"
    """Where a priority goes: body (vLLM's ``priority`` field), header (``priority_header``) or both."""
    priority_header: str = "x-kvmesh-priority"
    model: str | None = None
    t0: float = field(default_factory=time.monotonic)
    records: list[dict] = field(default_factory=list)
    in_flight: int = 0
    _n: int = 0

    def body(self, tenant: LoadTenant, max_tokens: int, priority: int | None) -> tuple[dict, dict]:
        """(JSON body, headers) of one request: a fresh prompt (a unique number first, so nothing is cached)."""
        self._n += 1
        body = {"prompt": f"{self._n} Once upon a time, {STORY}", "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True, "temperature": 0, "user": tenant.user}
        if self.model:
            body["model"] = self.model
        headers = {"Authorization": f"Bearer {tenant.api_key}"} if tenant.api_key else {}
        if priority is not None and self.priority_in in ("body", "both"):
            body["priority"] = priority
        if priority is not None and self.priority_in in ("header", "both"):
            headers[self.priority_header] = str(priority)
        return body, headers

    async def one(self, session: aiohttp.ClientSession, phase: str, cls: str, tenant: LoadTenant, max_tokens: int,
                  priority: int | None = None) -> dict:
        """Send one request and record how it ended (never raises, except CancelledError after recording)."""
        body, headers = self.body(tenant, max_tokens, priority)
        start = time.monotonic()
        rec = {"phase": phase, "cls": cls, "t": round(start - self.t0, 4), "outcome": "pending", "status": None,
               "ttft_s": None, "answer_s": None, "e2e_s": None, "retry_after": None, "tokens": 0}
        self.records.append(rec)
        self.in_flight += 1
        try:
            await asyncio.wait_for(self._stream(session, body, headers, rec, start), self.client_timeout_s)
        except asyncio.TimeoutError:
            rec["outcome"] = "timeout"
        except asyncio.CancelledError:
            rec["outcome"] = "cancelled"
            raise
        except (aiohttp.ClientError, OSError, ValueError) as e:
            rec["outcome"], rec["error"] = ("stream_error" if rec["status"] == 200 else "error"), str(e)[:200]
        finally:
            self.in_flight -= 1
        return rec

    async def _stream(self, session, body: dict, headers: dict, rec: dict, start: float) -> None:
        async with session.post(self.url + "/v1/completions", json=body, headers=headers) as r:
            rec["status"], rec["answer_s"] = r.status, round(time.monotonic() - start, 4)
            rec["retry_after"] = r.headers.get("Retry-After")
            if r.status != 200:
                rec["outcome"] = "429" if r.status == 429 else "5xx" if r.status >= 500 else "4xx"
                rec["error"] = (await r.read())[:160].decode(errors="replace")
                return
            async for raw in r.content:
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    rec["outcome"] = "ok" if "error" not in rec else "stream_error"
                    rec["e2e_s"] = round(time.monotonic() - start, 4)
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    rec["error"] = str(chunk["error"])[:200]
                    continue
                if any(c.get("text") for c in chunk.get("choices") or ()):
                    rec["tokens"] += 1
                    if rec["ttft_s"] is None:
                        rec["ttft_s"] = round(time.monotonic() - start, 4)
            rec["outcome"] = "stream_error"  # the stream ended without [DONE]


def not_sent(driver: Driver, phase: str, cls: str) -> None:
    """Record an arrival the in-flight cap turned away (it counts against its class)."""
    driver.records.append({"phase": phase, "cls": cls, "t": round(time.monotonic() - driver.t0, 4),
                           "outcome": "not_sent", "status": None, "ttft_s": None, "answer_s": None, "e2e_s": None,
                           "retry_after": None, "tokens": 0})


async def ticker(period_s: float, until: float, send: Callable[[], Awaitable]) -> list[asyncio.Task]:
    """Start ``send()`` every ``period_s`` seconds (open loop: a slow answer does not delay the next) until the
    monotonic time ``until``; the started tasks (the caller awaits or cancels them)."""
    tasks, next_at = [], time.monotonic()
    while next_at < until:
        tasks.append(asyncio.ensure_future(send()))
        next_at += period_s
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return tasks


async def closed_loop(clients: int, until: float, send: Callable[[], Awaitable[dict]],
                      retry_after_cap_s: float) -> None:
    """``clients`` clients, each sending its next request when its last one ended, until ``until``. After a 429 a
    client waits its ``Retry-After`` (at most ``retry_after_cap_s``; 0.1 s without one), as a polite flood would."""

    async def client() -> None:
        while time.monotonic() < until:
            rec = await send()
            if rec["outcome"] not in ("ok", "stream_error"):
                await asyncio.sleep(min(retry_after_cap_s, _seconds(rec["retry_after"], 0.1)))

    await asyncio.gather(*(client() for _ in range(clients)))


def _seconds(header: str | None, default: float) -> float:
    try:
        return max(0.0, float(header)) if header is not None else default
    except ValueError:
        return default


async def open_loop(rate_per_s: float, until: float, send: Callable[[int], Awaitable], may_send: Callable[[int], bool],
                    refuse: Callable[[int], None]) -> list[asyncio.Task]:
    """Arrivals evenly spaced at ``rate_per_s`` until ``until``; arrival i runs ``send(i)``, or ``refuse(i)`` when
    ``may_send(i)`` says no (the driver's cap on requests in flight). The started tasks (the caller awaits or
    cancels them)."""
    tasks, i, start = [], 0, time.monotonic()
    while (at := start + i / rate_per_s) < until:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        if not may_send(i):
            refuse(i)
        else:
            tasks.append(asyncio.ensure_future(send(i)))
        i += 1
    return tasks


async def settle(tasks: list[asyncio.Task], grace_s: float) -> int:
    """Wait up to ``grace_s`` for ``tasks``, then cancel what is left (recorded as cancelled); how many were."""
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=grace_s)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=10)
    return len(pending)


def open_session() -> aiohttp.ClientSession:
    """One session for the whole run: no connection limit, no timeout of its own (``Driver`` bounds each
    request)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0))
