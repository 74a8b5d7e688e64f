"""Prometheus metrics of route receipts (router/routing/receipts.py), on the router's registry.

Wiring (router/http/metrics.py + proxy.py)::

    rm = ReceiptMetrics(metrics.registry, router.receipts)
    rm.on_route(decision.receipt)                          # once per request, after routing
    rm.on_actual(router.receipts.record_actual(decision.receipt, cached_tokens))   # when usage arrives
    rm.on_ttft(decision.receipt)                           # a stream's first bytes (KVRouter.observe_ttft)

Counters are per chosen replica; the two ratios users ask for are gauges read at scrape time
from ``Receipts`` (cluster-wide and per replica):

    kvmesh_router_route_decisions_total{replica, reason}        reason: cache | load | session | fallback
    kvmesh_router_available_hit_tokens_total{replica}           best hit any candidate offered
    kvmesh_router_predicted_host_hit_tokens_total{replica}      the part of the predicted hit from the host tier
    kvmesh_router_reported_host_cached_tokens_total{replica}    the part of the reported hit the replica loaded back
    kvmesh_router_receipt_mispredicted_total{replica}           reported cached tokens != predicted
    kvmesh_router_captured_reuse_ratio{replica}                 captured / available ("" = cluster)
    kvmesh_router_mispredicted_ratio{replica}                   mispredicted / completed ("" = cluster)
    kvmesh_router_ttft_actual_over_predicted{replica}           histogram: observed / predicted TTFT
"""

from __future__ import annotations

from kvmesh.router.http.ceiling_metrics import CeilingCollector
from kvmesh.router.http.loop_counter import LoopCounter
from kvmesh.router.http.loop_histogram import LoopHistogram
from kvmesh.router.routing.receipts import Receipts, RouteReceipt
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

TTFT_RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0)
"""Actual / predicted TTFT: 1 is a perfect prediction; the buckets are symmetric in log around it."""


class ReceiptMetrics:
    """Counters updated per receipt plus a scrape-time collector of the ratios."""

    def __init__(self, registry: CollectorRegistry, receipts: Receipts) -> None:
        # counted per request on the event loop: LoopCounter / LoopHistogram (no lock; the scrape runs there too)
        self.decisions = LoopCounter("kvmesh_router_route_decisions", "Routing decisions per chosen replica and reason",
                                     ["replica", "reason"], registry)
        self.available = LoopCounter("kvmesh_router_available_hit_tokens",
                                     "Best prefix hit (tokens) any candidate replica offered, per chosen replica",
                                     ["replica"], registry)
        self.predicted_host = LoopCounter("kvmesh_router_predicted_host_hit_tokens",
                                          "Part of the predicted prefix hit (tokens) the chosen replica loads back "
                                          "from its host tier", ["replica"], registry)
        self.reported_host = LoopCounter("kvmesh_router_reported_host_cached_tokens",
                                         "Cached prompt tokens the replica reported loading back from its host tier",
                                         ["replica"], registry)
        self.mispredicted = LoopCounter("kvmesh_router_receipt_mispredicted",
                                        "Requests whose reported cached tokens differed from the router's prediction",
                                        ["replica"], registry)
        self.ttft_ratio = LoopHistogram("kvmesh_router_ttft_actual_over_predicted",
                                        "Observed time to first token (routing to the first streamed bytes) / the "
                                        "router's prediction for it (router/routing/cost/), per chosen replica",
                                        ["replica"], TTFT_RATIO_BUCKETS, registry)
        registry.register(_RatioCollector(receipts))
        registry.register(CeilingCollector(receipts.ceiling))  # the live single-pool ceiling (ceiling_metrics.py)

    def on_route(self, receipt: RouteReceipt) -> None:
        rid = str(receipt.replica_id)
        self.decisions.labels(rid, receipt.reason).inc()
        self.available.labels(rid).inc(receipt.best_hit_tokens)
        if receipt.predicted_host_tokens:
            self.predicted_host.labels(rid).inc(receipt.predicted_host_tokens)

    def on_ttft(self, receipt: RouteReceipt) -> None:
        """A streamed request's first bytes came: its observed TTFT against the prediction (when priced)."""
        if receipt.predicted_ttft_s and receipt.actual_ttft_s is not None:
            ratio = receipt.actual_ttft_s / receipt.predicted_ttft_s
            self.ttft_ratio.labels(str(receipt.replica_id)).observe(ratio)

    def on_actual(self, receipt: RouteReceipt) -> None:
        if receipt.actual_host_cached_tokens:
            self.reported_host.labels(str(receipt.replica_id)).inc(receipt.actual_host_cached_tokens)
        if receipt.mispredicted:
            self.mispredicted.labels(str(receipt.replica_id)).inc()


class _RatioCollector:
    def __init__(self, receipts: Receipts) -> None:
        self.receipts = receipts

    def collect(self):
        summary = self.receipts.summary()
        rows = [("", summary["cluster"]), *summary["replicas"].items()]
        captured = GaugeMetricFamily("kvmesh_router_captured_reuse_ratio",
                                     "Cached tokens the replicas reported / best hit offered at routing "
                                     "(replica \"\" = cluster-wide)", labels=["replica"])
        mispredicted = GaugeMetricFamily("kvmesh_router_mispredicted_ratio",
                                         "Share of requests whose reported hit differed from the prediction "
                                         "(replica \"\" = cluster-wide)", labels=["replica"])
        for rid, totals in rows:
            captured.add_metric([rid], totals["captured_ratio"])
            mispredicted.add_metric([rid], totals["mispredicted_rate"])
        yield captured
        yield mispredicted
