"""The load of ``kvmesh bench soak``: ``concurrency`` closed-loop clients through the router until a deadline, each
drawing its next request's kind from its own ``random.Random`` (the run's seed and its index, so the sequence of
kinds is the same every run), waiting ``think_s`` between requests; every outcome goes to a ``SoakTally``
(support/soak_verdict.py). A request that times out or loses its connection is a failure with that reason."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.soak_hostile import hostile
from kvmesh.cluster.measure.benchmarks.support.soak_kinds import KINDS
from kvmesh.cluster.measure.benchmarks.support.soak_verdict import SoakTally


@dataclass(frozen=True)
class TrafficSettings:
    concurrency: int = 3
    """Clients, each with one request in flight at most."""
    think_s: float = 0.2
    """Seconds a client waits after each answer."""
    hostile_weight: int = 3
    """The hostile requests' weight in the mix (the well-formed kinds': soak_kinds.KINDS)."""
    timeout_s: float = 120.0
    """Seconds one request (a Responses conversation: each call) may take before it counts as failed."""
    seed: int = 0


async def drive(url: str, key: str, settings: TrafficSettings, deadline: float, tally: SoakTally, t0: float) -> None:
    """Load until ``time.monotonic()`` passes ``deadline`` (requests in flight then are finished and counted)."""
    timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
    async with aiohttp.ClientSession(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                     timeout=timeout) as session:
        await asyncio.gather(*(_client(session, settings, i, deadline, tally, t0)
                               for i in range(settings.concurrency)))


async def _client(session: aiohttp.ClientSession, settings: TrafficSettings, index: int, deadline: float,
                  tally: SoakTally, t0: float) -> None:
    rng = random.Random(settings.seed * 1000 + index)
    names = [*KINDS, "hostile"]
    weights = [w for _, w in KINDS.values()] + [settings.hostile_weight]
    while time.monotonic() < deadline:
        kind = rng.choices(names, weights)[0]
        label = None
        try:
            if kind == "hostile":
                label, reason = await hostile(session, rng)
            else:
                reason = await KINDS[kind][0](session, rng)
        except asyncio.TimeoutError:
            reason = f"no answer within {settings.timeout_s:g} s"
        except aiohttp.ClientError as e:
            reason = f"{type(e).__name__}: {e}"
        tally.record(kind, reason, time.monotonic() - t0, label)
        await asyncio.sleep(settings.think_s)
