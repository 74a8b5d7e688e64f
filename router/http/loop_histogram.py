"""A labelled Prometheus histogram updated from one thread only (the router's event loop), cheaply.

    h = LoopHistogram("kvmesh_router_routing_seconds", "doc", ["stage"], buckets, registry)
    h.labels("hash").observe(3e-6)          # a bisect and two additions, no lock

prometheus_client's ``Histogram.observe`` takes a lock for the sum and one for the bucket and walks the
bounds in Python (~3 µs); the router observes five of them per request. Here a child holds plain
per-bucket counts, turned cumulative at scrape time. Only for metrics observed on the event loop (the
scrape runs there too), so no lock is needed. Exposed as a histogram family: ``_bucket``, ``_count``,
``_sum`` and ``_created``, like prometheus_client's.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Sequence

from kvmesh.router.http.loop_metric import LoopMetric
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class LoopHistogramChild:
    """One label set's counts (per bucket, not cumulative), sum and creation time."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose upper bound is >= it (Prometheus' ``le``)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class LoopHistogram(LoopMetric[LoopHistogramChild]):
    """A histogram metric with labels (see the module doc); registers itself with ``registry``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Iterable[float],
                 registry: CollectorRegistry) -> None:
        bounds = sorted(float(b) for b in buckets)
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = bounds
        super().__init__(name, documentation, labelnames, registry)

    def new_child(self) -> LoopHistogramChild:
        return LoopHistogramChild(self.bounds)

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            buckets, total = [], 0
            for bound, count in zip(self.bounds, child.counts, strict=True):
                total += count
                buckets.append((floatToGoString(bound), total))
            family.add_metric(list(values), buckets, child.sum)
            family.samples.append(Sample(self.name + "_created", dict(zip(self.labelnames, values, strict=True)),
                                         child.created))
        yield family

