"""What a multi-router run reads of its routers: their URLs (asked of Ray again while one restarts), when a killed
one routes again, when every router's view of every replica is idle, and a run's summary."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.ray_nodes import PlacedServe
from kvmesh.cluster.measure.benchmarks.support.spread_client import Outcome, hit_rate

REJOIN_TIMEOUT_S = 120.0
"""Longest wait for a killed router to answer a completion again."""
SETTLE_TIMEOUT_S = 60.0
"""Longest wait for every router to see every replica idle after a run."""
POLL_S = 0.25


class RouterViews:
    """The placed routers of ``serve``, as clients and the run see them."""

    def __init__(self, serve: PlacedServe, num_replicas: int, client_key: str) -> None:
        self.serve, self.num_replicas = serve, num_replicas
        self.client_headers = {"Authorization": f"Bearer {client_key}"}
        """What the run's clients send (the routers' API key)."""
        self._urls: list[str] = []

    def urls(self) -> list[str]:
        return list(self._urls)

    def refresh(self, timeout_s: float = 30.0) -> None:
        self._urls = self.serve.router_urls(timeout_s)

    def pid(self, index: int) -> int:
        import ray

        return ray.get(self.serve.router(index).pid.remote(), timeout=30)

    def sync_counters(self) -> list[dict | None]:
        """Each placed router's sync stream counters, in order (``NodeRouter.sync_counters``; None: sync off)."""
        import ray

        return ray.get([self.serve.router(i).sync_counters.remote() for i in range(len(self.urls()))], timeout=30)

    async def wait_rejoined(self, index: int, killed_at: list[float], model: str) -> float | None:
        """Seconds from the kill until router ``index`` (restarted by Ray) answers a completion; None: not in time."""
        while not killed_at:
            await asyncio.sleep(0.05)
        deadline = killed_at[0] + REJOIN_TIMEOUT_S
        body = {"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 1}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), headers=self.client_headers) as http:
            while time.monotonic() < deadline:
                try:
                    await asyncio.to_thread(self.refresh, 2.0)
                    async with http.post(self._urls[index] + "/v1/completions", json=body) as response:
                        if response.status == 200:
                            return round(time.monotonic() - killed_at[0], 2)
                except Exception:  # noqa: BLE001 - not back yet (the actor restarting, the port not open)
                    pass
                await asyncio.sleep(POLL_S)
        return None

    async def wait_settled(self) -> float | None:
        """Seconds until every router's ``/replicas`` shows every replica with nothing in flight, nothing running and
        no prefill queued (its own bookings and the replica's ``/load``); None: not within ``SETTLE_TIMEOUT_S``."""
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {self.serve.admin_key}"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), headers=headers) as http:
            while time.monotonic() - started < SETTLE_TIMEOUT_S:
                if await self._all_idle(http):
                    return round(time.monotonic() - started, 2)
                await asyncio.sleep(POLL_S)
        return None

    async def owner_request_status(self) -> int:
        """What a placed router answers a request that changes the replica set (a drain, with the admin key)."""
        headers = {"Authorization": f"Bearer {self.serve.admin_key}"}
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), headers=headers) as http,
                    http.post(self._urls[0] + "/replicas/replica-0/drain") as response):
            return response.status

    async def _all_idle(self, http: aiohttp.ClientSession) -> bool:
        for url in self._urls:
            try:
                async with http.get(url + "/replicas") as response:
                    rows = (await response.json(content_type=None))["replicas"]
            except Exception:  # noqa: BLE001 - a router not answering is not idle
                return False
            busy = any(r["in_flight"] or r["prefill_backlog"] or r.get("running") for r in rows)
            if len(rows) < self.num_replicas or busy:
                return False
        return True


def summary(outcomes: list[Outcome], killed: int | None = None) -> dict:
    """A run: requests, hit rate, failures (in all and through each router), moves and fail-fast times."""
    routers = sorted({o.router for o in outcomes} | {r for o in outcomes for r in o.moved_from or ()})
    fast = [s for o in outcomes for s in o.failed_fast_s or ()]
    out = {"requests": len(outcomes), "ok": sum(o.ok for o in outcomes), "hit_rate": round(hit_rate(outcomes), 4),
           "failed": sum(not o.ok for o in outcomes),
           "failed_by_router": {str(r): sum(not o.ok for o in outcomes if o.router == r) for r in routers},
           "moved": sum(bool(o.moved_from) for o in outcomes),
           "failed_fast_max_s": round(max(fast), 3) if fast else None,
           "errors": sorted({o.error for o in outcomes if o.error})[:5]}
    if killed is not None:
        others = [o for o in outcomes if o.router != killed]
        out["failed_through_others"] = sum(not o.ok for o in others)
        out["moved_off_killed"] = sum(killed in (o.moved_from or ()) for o in outcomes)
    return out


def merged(runs: list[dict]) -> dict:
    """Trials of one run as one summary: counts summed, the hit rate the trials' mean, each trial's kept."""
    out = {k: sum(r[k] for r in runs) for k in ("requests", "ok", "failed", "moved")}
    rates = [r["hit_rate"] for r in runs]
    out.update(hit_rate=round(sum(rates) / len(rates), 4), hit_rates=rates,
               failed_by_router={k: sum(r["failed_by_router"].get(k, 0) for r in runs)
                                 for k in sorted({k for r in runs for k in r["failed_by_router"]})},
               failed_fast_max_s=max((r["failed_fast_max_s"] for r in runs if r["failed_fast_max_s"] is not None),
                                     default=None),
               errors=sorted({e for r in runs for e in r["errors"]})[:5])
    return out
