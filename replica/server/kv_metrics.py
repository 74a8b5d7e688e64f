"""The replica's KV transfer metrics, on its private Prometheus registry.

    kvmesh_kv_transfer_pulls_total{outcome="ok|failed|skipped"}   counter, pulls this replica tried
    kvmesh_kv_transfer_pulled_tokens_total, _pulled_bytes_total    counters, what the ok pulls moved
    kvmesh_kv_transfer_pull_seconds                                histogram, lease + handshake + read + release
    kvmesh_kv_transfer_leases_active                               gauge, leases this replica holds for peers
    kvmesh_kv_transfer_leases_total{end="released|expired"}        counter, how its leases ended
    kvmesh_kv_transfer_quarantined_blocks                          gauge, blocks of failed pulls held until the
                                                                   transport confirms their read is over

Exported (as zeros) on every replica, transfer enabled or not, so dashboards query one set of series.
kvmesh's names carry no ``:`` (metrics.py: that is for vLLM's names and recording rules).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kvmesh.replica.serving.metric_buckets import TTFT_BUCKETS
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

OUTCOMES = ("ok", "failed", "skipped")
"""How a pull ends (the ``x-kvmesh-kv-pull`` header's values)."""

LeaseCounts = Callable[[], tuple[int, int, int]]
"""(active, released, expired) of the engine's lease table, read racily at scrape time."""


class _LeaseCollector(Collector):
    def __init__(self, counts: LeaseCounts, quarantined: Callable[[], int]) -> None:
        self.counts, self.quarantined = counts, quarantined

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("kvmesh_kv_transfer_quarantined_blocks",
                                "KV blocks of failed pulls held until the transport confirms their read is over.",
                                value=self.quarantined())
        active, released, expired = self.counts()
        yield GaugeMetricFamily("kvmesh_kv_transfer_leases_active", "Leases this replica holds blocks for.",
                                value=active)
        ended = CounterMetricFamily("kvmesh_kv_transfer_leases", "Leases ended, by how.", labels=["end"])
        ended.add_metric(["released"], released)
        ended.add_metric(["expired"], expired)
        yield ended


class KVTransferMetrics:
    """Counters of the pulls this replica tried and a view of its leases."""

    def __init__(self, registry: CollectorRegistry, lease_counts: LeaseCounts,
                 quarantined_blocks: Callable[[], int] = lambda: 0) -> None:
        self.pulls = Counter("kvmesh_kv_transfer_pulls", "KV pulls from a peer replica, by outcome.", ["outcome"],
                             registry=registry)
        for outcome in OUTCOMES:
            self.pulls.labels(outcome)
        self.pulled_tokens = Counter("kvmesh_kv_transfer_pulled_tokens", "Prompt tokens pulled from peers.",
                                     registry=registry)
        self.pulled_bytes = Counter("kvmesh_kv_transfer_pulled_bytes", "KV bytes pulled from peers.",
                                    registry=registry)
        self.pull_seconds = Histogram("kvmesh_kv_transfer_pull_seconds",
                                      "Seconds a pull took (lease, handshake, read, release).",
                                      buckets=TTFT_BUCKETS, registry=registry)
        registry.register(_LeaseCollector(lease_counts, quarantined_blocks))

    def record_pull(self, outcome: str, tokens: int, num_bytes: int, seconds: float) -> None:
        self.pulls.labels(outcome).inc()
        self.pulled_tokens.inc(tokens)
        self.pulled_bytes.inc(num_bytes)
        self.pull_seconds.observe(seconds)
