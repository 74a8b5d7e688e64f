"""A labelled Prometheus counter incremented from one thread only (the router's event loop), cheaply.

    c = LoopCounter("kvmesh_router_requests", "doc", ["status"], registry)
    c.labels("2xx").inc()                   # one addition, no lock

prometheus_client's ``Counter.inc`` checks the metric is observable and takes a lock (~1 µs); the router counts
several per request. Here a child holds a plain float. Only for counters incremented on the event loop (the scrape
runs there too), so no lock is needed. Exposed as a counter family (``_total`` and ``_created``), like
prometheus_client's; the same cheap-child idea as loop_histogram.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily


class LoopCounterChild:
    """One label set's count and creation time."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (>= 0: a counter only goes up)."""
        if amount < 0:
            raise ValueError(f"a counter only goes up: inc({amount})")
        self.value += amount


class LoopCounter:
    """A counter metric with labels (see the module doc); registers itself with ``registry``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self.children: dict[tuple[str, ...], LoopCounterChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> LoopCounterChild:
        child = self.children.get(values)  # the usual case: a label set seen before, given as strings
        if child is not None:
            return child
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = LoopCounterChild()
        return child

    def collect(self):
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            family.add_metric(list(values), child.value, created=child.created)
        yield family
