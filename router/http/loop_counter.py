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

from kvmesh.router.http.loop_metric import LoopMetric
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


class LoopCounter(LoopMetric[LoopCounterChild]):
    """A counter metric with labels (see the module doc); registers itself with ``registry``."""

    def new_child(self) -> LoopCounterChild:
        return LoopCounterChild()

    def collect(self):
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            family.add_metric(list(values), child.value, created=child.created)
        yield family
