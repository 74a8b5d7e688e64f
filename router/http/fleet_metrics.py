"""The fleet's ``vllm:*`` series on the router's ``/metrics``: one scrape target for a dashboard built for vLLM.

When the router's ``/metrics`` is scraped, ``FleetMetrics.refresh`` first reads every registered replica's own
``/metrics`` (kvmesh replicas and vLLM servers alike, concurrently, within the upstream connect timeout) and keeps
only vLLM's families (``vllm:*``). ``collect`` then yields each family once, its samples those of every replica,
unchanged but for one added label, ``replica`` (the router's replica id, as on ``kvmesh_router_*``)::

    vllm:num_requests_running{engine="0",model_name="m",replica="r0"} 3.0
    vllm:num_requests_running{engine="0",model_name="m",replica="r1"} 1.0

so a query that sums by ``model_name`` (vLLM's dashboards do) reads the fleet, and one by ``replica`` each replica.
Bounded: the replicas are the router's own set, and each gives at most ``MAX_SERIES_PER_REPLICA`` samples from a
body of at most ``MAX_BODY_BYTES``; a replica that could not be read (no answer, an error status, a body that is not
the text format) gives none this time, and ``kvmesh_router_fleet_scrape_up{replica}`` says so (1 read, 0 not).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica

logger = logging.getLogger(__name__)

VLLM_PREFIX = "vllm:"
MAX_SERIES_PER_REPLICA = 4096
"""Samples kept from one replica's scrape (vLLM's ~30 families with their buckets use a few hundred)."""
MAX_BODY_BYTES = 4 << 20
"""A replica's /metrics body longer than this is not read (a hostile or broken replica)."""
REPLICA_LABEL = "replica"

Fetch = Callable[[str], Awaitable[tuple[int, bytes]]]
"""GET a replica's /metrics by its URL: (status, body); whatever it raises counts as "not read" for that replica."""


def vllm_families(text: str, max_series: int = MAX_SERIES_PER_REPLICA) -> list[Metric]:
    """vLLM's families of a text exposition, at most ``max_series`` samples in all (later ones are dropped).
    Raises ValueError for a body that is not the text format."""
    kept: list[Metric] = []
    budget = max_series
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(VLLM_PREFIX) or budget <= 0:
            continue
        samples = family.samples[:budget]
        budget -= len(samples)
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        copy.samples = samples
        kept.append(copy)
    return kept


class FleetMetrics:
    """The replicas' latest ``vllm:*`` families (``refresh``), yielded relabelled by ``collect`` (a registry
    collector)."""

    def __init__(self) -> None:
        self._scraped: list[tuple[Replica, list[Metric] | None]] = []
        """Each replica of the last refresh and its families (None: not read)."""

    async def refresh(self, replicas: Iterable[Replica], fetch: Fetch) -> None:
        """Read each replica's /metrics (those with a URL); replicas no longer listed are forgotten."""
        listed = [r for r in replicas if r.spec is not None]
        read = await asyncio.gather(*(self._read(replica, fetch) for replica in listed))
        self._scraped = list(zip(listed, read, strict=True))

    @staticmethod
    async def _read(replica: Replica, fetch: Fetch) -> list[Metric] | None:
        try:
            status, body = await fetch(replica.spec.url)
            if status != 200:
                raise ValueError(f"HTTP {status}")
            if len(body) > MAX_BODY_BYTES:
                raise ValueError(f"a body of {len(body)} bytes (at most {MAX_BODY_BYTES} are read)")
            return vllm_families(body.decode("utf-8", "replace"))
        except Exception as e:  # noqa: BLE001 -- a replica gone, refusing or answering garbage: not read this time
            logger.debug("replica %s: /metrics not read: %r", replica.id, e)
            return None

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for replica, families in self._scraped:
            for family in families or ():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(s._replace(labels={**s.labels, REPLICA_LABEL: replica.id}) for s in family.samples)
        yield from merged.values()
        up = GaugeMetricFamily("kvmesh_router_fleet_scrape_up",
                               "1 when the router read the replica's vllm:* series for this scrape, else 0",
                               labels=[REPLICA_LABEL])
        for replica, families in self._scraped:
            up.add_metric([replica.id], 1.0 if families is not None else 0.0)
        yield up
