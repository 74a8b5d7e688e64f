"""Metric families labelled by tenant whose exposition names only the busiest tenants (admission_metrics.py).

A request's tenant is whatever its key (or ``user``) says, so a tenant label is unbounded; these families keep each
tracked tenant's counts in memory and, at each scrape, name the ``top_n`` tenants with the most usage (the
``usage`` family's total) and sum every other under ``OTHER``:

    kvmesh_router_admission_admitted_total{priority="0",tenant="team-a"}    the busiest tenants, by name
    kvmesh_router_admission_admitted_total{priority="0",tenant="*other*"}   everyone else, summed

Counters stay monotonic: a tenant that climbs into the top N from ``OTHER`` leaves what it counted there (its own
series starts at 0: a cell's ``base``), one that drops out adds its own to ``OTHER``. Tenants held in memory are
bounded too (``max_tracked``): past it, the half with the least usage (none of them waiting) is folded into
``OTHER`` for good, and a tenant that comes back starts again at 0. Updated and scraped on the router's event
loop only (no locks), like ``LoopHistogram``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

OTHER = "*other*"
"""The tenant label of every tenant outside the top N."""
KINDS = ("counter", "gauge", "histogram")


class Cell:
    """One label set's value (counters, gauges) or per-bucket counts then the sum (histograms)."""

    __slots__ = ("values", "base", "bounds")

    def __init__(self, bounds: list[float] | None = None) -> None:
        self.bounds = bounds
        self.values = [0.0] * (1 if bounds is None else len(bounds) + 1)
        self.base: list[float] | None = None
        """What it had counted when its tenant got its name (that part stays in ``OTHER``); None: nothing."""

    def inc(self, amount: float = 1.0) -> None:
        self.values[0] += amount

    def dec(self, amount: float = 1.0) -> None:
        self.values[0] -= amount

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose upper bound is >= it (Prometheus' ``le``)."""
        self.values[bisect.bisect_left(self.bounds, value)] += 1
        self.values[-1] += value


class TenantFamily:
    """A metric whose first label is the tenant (``labels(tenant, ...)`` -> its ``Cell``)."""

    def __init__(self, book: TenantBook, name: str, documentation: str, labelnames: Sequence[str], kind: str,
                 buckets: Iterable[float] = ()) -> None:
        assert kind in KINDS and labelnames[0] == "tenant", (kind, labelnames)
        self.book, self.name, self.documentation, self.labelnames, self.kind = book, name, documentation, \
            list(labelnames), kind
        bounds = sorted(float(b) for b in buckets)
        if kind == "histogram" and bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = bounds if kind == "histogram" else None
        self.cells: dict[tuple[str, ...], Cell] = {}
        book.families.append(self)

    def labels(self, *values: str) -> Cell:
        cell = self.cells.get(values)
        if cell is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            cell = self.cells[values] = Cell(self.bounds)
            if values[0] != OTHER:
                self.book.track(values[0], self, values)
        return cell

    def family(self, named: set[str]):
        """The exposition: ``named`` tenants by name, the rest summed under ``OTHER``."""
        rows: dict[tuple[str, ...], list[float]] = {}
        for key, cell in self.cells.items():
            if key[0] in named:
                own = cell.values if cell.base is None else [v - b for v, b in zip(cell.values, cell.base, strict=True)]
                _add(rows, key, own)
                if cell.base is not None:
                    _add(rows, (OTHER, *key[1:]), cell.base)
            else:
                _add(rows, (OTHER, *key[1:]), cell.values)
        if self.kind == "histogram":
            fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
            for key, values in rows.items():
                cumulative, total = [], 0.0
                for bound, count in zip(self.bounds, values, strict=False):
                    total += count
                    cumulative.append((floatToGoString(bound), total))
                fam.add_metric(list(key), cumulative, values[-1])
            return fam
        single = (CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily)(
            self.name, self.documentation, labels=self.labelnames)
        for key, values in rows.items():
            single.add_metric(list(key), values[0])
        return single


def _add(rows: dict[tuple[str, ...], list[float]], key: tuple[str, ...], values: list[float]) -> None:
    row = rows.get(key)
    if row is None:
        rows[key] = list(values)
    else:
        for i, v in enumerate(values):
            row[i] += v


class TenantBook:
    """The tenants the families count (module doc); a collector on ``registry``."""

    def __init__(self, registry: CollectorRegistry, top_n: int, max_tracked: int) -> None:
        self.top_n, self.max_tracked = top_n, max_tracked
        self.families: list[TenantFamily] = []
        self.usage: TenantFamily | None = None
        """The family whose total per tenant ranks tenants (set by the owner; None: ranked by name only)."""
        self.tracked: dict[str, list[tuple[TenantFamily, tuple[str, ...]]]] = {}
        self.named: set[str] = set()
        """The tenants the last scrape named."""
        self.in_other: set[str] = set()
        """The tenants the last scrape counted under ``OTHER``."""
        registry.register(self)

    def track(self, tenant: str, family: TenantFamily, key: tuple[str, ...]) -> None:
        cells = self.tracked.get(tenant)
        if cells is None:
            if len(self.tracked) >= self.max_tracked:
                self._fold_least()
            cells = self.tracked[tenant] = []
        cells.append((family, key))

    def usage_of(self, tenant: str) -> float:
        return sum(fam.cells[key].values[0] for fam, key in self.tracked.get(tenant, ()) if fam is self.usage)

    def _waiting(self, tenant: str) -> bool:
        return any(fam.kind == "gauge" and fam.cells[key].values[0] for fam, key in self.tracked[tenant])

    def _fold_least(self) -> None:
        """Fold the half of the tracked tenants with the least usage (none waiting) into ``OTHER`` for good."""
        ranked = sorted((t for t in self.tracked if not self._waiting(t)), key=lambda t: (self.usage_of(t), t))
        for tenant in ranked[:max(1, len(self.tracked) // 2)]:
            for fam, key in self.tracked.pop(tenant):
                cell = fam.cells.pop(key)
                if fam.kind != "gauge":
                    into = fam.labels(OTHER, *key[1:]).values
                    for i, v in enumerate(cell.values):
                        into[i] += v
            self.named.discard(tenant)
            self.in_other.discard(tenant)

    def collect(self):
        named = set(sorted(self.tracked, key=lambda t: (-self.usage_of(t), t))[:self.top_n])
        for tenant in named & self.in_other:  # climbed in: what it counted so far stays in OTHER
            for fam, key in self.tracked[tenant]:
                if fam.kind != "gauge":
                    cell = fam.cells[key]
                    cell.base = list(cell.values)
        for tenant in self.named - named:  # dropped out: all of it goes to OTHER
            for fam, key in self.tracked.get(tenant, ()):
                fam.cells[key].base = None
        self.named, self.in_other = named, set(self.tracked) - named
        for fam in self.families:
            yield fam.family(named)
