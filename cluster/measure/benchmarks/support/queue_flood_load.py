"""The client half of ``kvmesh bench queue-flood``: a flooding tenant that retries at once, a light tenant that
asks little, and what each got.

    flood   ``clients`` closed-loop clients, each sending its next request the moment the last one ended -- a 429
            included (``Retry-After`` ignored)
    light   one short request every ``period_s`` (open loop: a slow answer does not delay the next)

Requests are plain completions (not streamed) with ``ignore_eos``, a fresh prompt each (a unique number first, so
nothing is cached), named by the tenant's Bearer key or, without one, by ``user`` (a router with user tenants).
Every loop is bounded by the phase's deadline and every request by ``client_timeout_s``. First a warm-up
(``warmup`` requests at once, answered before the rest; class ``warmup``, left out of the summary), then the light
tenant alone for ``alone_s`` (class ``light_alone``: its latency on this machine without the flood).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.overload_load import STORY, LoadTenant, open_session
from kvmesh.router.admission.fair_share import weighted_tokens


@dataclass(slots=True)
class FloodPlan:
    """What the two tenants send."""

    flood: LoadTenant
    light: LoadTenant
    clients: int = 24
    """The flooding tenant's closed-loop clients."""
    seconds: float = 15.0
    """How long both send."""
    period_s: float = 0.3
    """The light tenant sends one request this often."""
    light_tokens: int = 8
    """``max_tokens`` of a light request."""
    flood_tokens: int = 64
    """``max_tokens`` of a flood request."""
    client_timeout_s: float = 30.0
    model: str | None = None
    alone_s: float = 5.0
    """The light tenant alone first, this long (its latency without the flood: the machine's own)."""
    warmup: int = 16
    """Requests sent together (tenant ``warmup``) and answered before the phase: the replicas' first steps are slow."""


@dataclass(slots=True)
class FloodRun:
    url: str
    plan: FloodPlan
    records: list[dict] = field(default_factory=list)
    t0: float = 0.0
    _n: int = 0

    async def one(self, session: aiohttp.ClientSession, cls: str, tenant: LoadTenant, max_tokens: int) -> dict:
        """One request; its record (status, latency, the 429's reason and message, the usage when served)."""
        self._n += 1
        body = {"prompt": f"{self._n} Once upon a time, {STORY}", "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "user": tenant.user, **({"model": self.plan.model} if self.plan.model else {})}
        headers = {"Authorization": f"Bearer {tenant.api_key}"} if tenant.api_key else {}
        start = time.monotonic()
        rec = {"cls": cls, "t": round(start - self.t0, 4), "status": None, "latency_s": None}
        self.records.append(rec)
        try:
            async with session.post(self.url + "/v1/completions", json=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=self.plan.client_timeout_s)) as r:
                data = await r.read()
                rec["status"], rec["latency_s"] = r.status, round(time.monotonic() - start, 4)
                answer = json.loads(data) if data[:1] == b"{" else {}
                if r.status == 200:
                    usage = answer.get("usage") or {}
                    rec["prompt_tokens"] = usage.get("prompt_tokens", 0)
                    rec["completion_tokens"] = usage.get("completion_tokens", 0)
                else:
                    error = answer.get("error") or {}
                    rec["reason"], rec["message"] = error.get("type"), str(error.get("message", data[:160]))[:240]
                    rec["retry_after"] = r.headers.get("Retry-After")
        except (aiohttp.ClientError, OSError, ValueError, asyncio.TimeoutError) as e:
            rec["status"], rec["error"] = "error", f"{type(e).__name__}: {e}"[:200]
        return rec

    async def run(self) -> list[dict]:
        """Warm up, the light tenant alone for ``alone_s``, then the flood and the light tenant for ``seconds``."""
        p = self.plan
        async with open_session() as session:
            self.t0 = time.monotonic()
            warm = LoadTenant("warmup", p.light.api_key)  # a keys file names no warm-up tenant: the light key's then
            await asyncio.gather(*(self.one(session, "warmup", warm, p.flood_tokens) for _ in range(p.warmup)))
            await self._light(session, "light_alone", time.monotonic() + p.alone_s)
            self.t0 = time.monotonic()
            until = self.t0 + p.seconds

            async def flood_client() -> None:
                while time.monotonic() < until:
                    await self.one(session, "flood", p.flood, p.flood_tokens)  # a 429: again at once

            await asyncio.gather(self._light(session, "light", until), *(flood_client() for _ in range(p.clients)))
        return self.records

    async def _light(self, session: aiohttp.ClientSession, cls: str, until: float) -> None:
        p, tasks, next_at = self.plan, [], time.monotonic()
        while next_at < until:
            tasks.append(asyncio.ensure_future(self.one(session, cls, p.light, p.light_tokens)))
            next_at += p.period_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _work(rec: dict) -> float:
    """A served request's work on the replicas in fair share's units (prompt x1, output x2)."""
    return weighted_tokens(rec.get("prompt_tokens", 0), rec.get("completion_tokens", 0))


def summarize(records: list[dict], light_tokens: int) -> dict:
    """Per tenant what it sent and got; the flooding tenant's share of the replicas' work against its fair share.

    Work is what fair share counts (prompt tokens x1, output x2, of the requests served). The fair share is
    max-min's: the light tenant is owed all it asked for (each request it sent as much as one of its served ones;
    none served: a prompt as long as the flood's and ``light_tokens`` out) up to half the work done, the flooding
    tenant the rest."""
    out: dict = {}
    for cls in ("flood", "light", "light_alone"):
        mine = [r for r in records if r["cls"] == cls]
        served = [r for r in mine if r["status"] == 200]
        refused: dict[str, int] = {}
        for r in mine:
            if r["status"] != 200:
                key = r.get("reason") or str(r["status"])
                refused[key] = refused.get(key, 0) + 1
        latencies = [r["latency_s"] for r in served]
        out[cls] = {"sent": len(mine), "served": len(served), "refused": refused,
                    "served_fraction": len(served) / len(mine) if mine else None,
                    "latency_p50_s": _quantile(latencies, 0.5), "latency_p90_s": _quantile(latencies, 0.9),
                    "work": sum(map(_work, served))}
    flood, light = out["flood"], out["light"]
    total = flood["work"] + light["work"]
    if light["served"]:
        light_asked = light["sent"] * light["work"] / light["served"]
    else:  # none served: a light request's prompt is as long as the flood's (support/overload_load.py's story)
        prompts = [r["prompt_tokens"] for r in records if r["status"] == 200]
        light_asked = light["sent"] * weighted_tokens(sum(prompts) / len(prompts) if prompts else 0, light_tokens)
    out["flood_share"] = flood["work"] / total if total else None
    out["flood_fair_share"] = 1.0 - min(light_asked / total, 0.5) if total else None
    return out
