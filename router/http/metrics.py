"""The router's Prometheus metrics, on a private registry (several routers can share a process).

Counters and histograms are updated per request; gauges that mirror state (index size, loads,
health, subscriber counters, event lag) are read at scrape time by a custom collector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from kvmesh.replica.openai.metrics_exposition import add_process_collectors
from kvmesh.replica.serving.metric_buckets import REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from kvmesh.router.http.loop_counter import LoopCounter
from kvmesh.router.http.loop_histogram import LoopHistogram
from kvmesh.router.replicas.replica import DEGRADED_CAUSES
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# Routing stages take microseconds; buckets from 1 µs to 100 ms.
_STAGE_BUCKETS = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 1e-1)
_LAG_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0)


class RouterMetrics:
    """Everything the router exposes on ``/metrics``."""

    def __init__(self, state_source: Callable[[], dict] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        add_process_collectors(r)
        # observed per request on the event loop: LoopHistogram (~0.4 µs per observe, not ~3)
        self.request_latency = LoopHistogram(
            "kvmesh_router_request_latency_seconds",
            "Proxied requests, from the request reaching the router to its last byte leaving it",
            ["model_name"], REQUEST_LATENCY_BUCKETS, r)
        self.ttft = LoopHistogram(
            "kvmesh_router_time_to_first_token_seconds",
            "Streamed requests, from the request reaching the router to the replica's first output bytes",
            ["model_name"], TTFT_BUCKETS, r)
        self.decisions = LoopCounter("kvmesh_router_decisions", "Requests routed, per replica and policy",
                                     ["replica", "policy"], r)
        self.predicted_hit_tokens = LoopCounter(
            "kvmesh_router_predicted_hit_tokens", "Prompt tokens the router expected the replica to have cached",
            ["replica"], r)
        self.reported_cached_tokens = LoopCounter(
            "kvmesh_router_reported_cached_tokens", "Cached prompt tokens the replica reported in usage",
            ["replica"], r)
        self.prompt_tokens = LoopCounter("kvmesh_router_prompt_tokens", "Prompt tokens routed", ["replica"], r)
        self.retries = Counter("kvmesh_router_retries", "Requests retried on another replica before any output",
                               ["replica"], registry=r)
        self.migrations = Counter("kvmesh_router_stream_migrations",
                                  "Streams continued on another replica after this one failed mid-way", ["replica"],
                                  registry=r)
        self.replica_failures = Counter(
            "kvmesh_router_replica_failures",
            "Failed answers per replica and kind (connect, http_5xx, first_byte_deadline, "
            "stream_idle_deadline, invalid_json, invalid_sse, mid_stream, probe)", ["replica", "kind"], registry=r)
        self.ejections = Counter("kvmesh_router_replica_ejections",
                                 "Times a replica was taken out of rotation after failures in a row "
                                 "(outlier detection)",
                                 ["replica"], registry=r)
        self.pd_splits = Counter("kvmesh_router_pd_splits",
                                 "Prompts long enough to prefill on a prefill replica: ok (prefilled there), "
                                 "prefill_failed (the decode replica computed it), skipped_no_room (no prefill replica "
                                 "had room), skipped_slower (priced slower than the decode replica, beyond the slack), "
                                 "skipped_layout (no prefill replica shares the decode replica's KV layout)",
                                 ["outcome"], registry=r)
        self.peer_pulls = Counter("kvmesh_router_peer_pulls",
                                  "Requests whose replica was asked to pull the prompt's prefix from the replica "
                                  "holding it",
                                  registry=r)
        self.kv_pulled_tokens = Counter("kvmesh_router_kv_pulled_tokens",
                                        "Prompt tokens whose KV the replicas reported pulling from another replica "
                                        "(x-kvmesh-kv-pulled-tokens), split and peer pulls", registry=r)
        self.requests = LoopCounter("kvmesh_router_requests", "Requests answered, per HTTP status class",
                                    ["status"], r)
        self.stage_seconds = LoopHistogram("kvmesh_router_routing_seconds",
                                           "Routing overhead per stage (tokenize, hash, match, score)",
                                           ["stage"], _STAGE_BUCKETS, r)
        self.event_lag = Histogram("kvmesh_router_event_lag_seconds",
                                   "Delay from a replica publishing an event batch to the router applying it",
                                   buckets=_LAG_BUCKETS, registry=r)
        self._children: dict[tuple, object] = {}
        if state_source is not None:
            r.register(_StateCollector(state_source))

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, cached (prometheus_client's ``labels`` is slow enough to show per request; a
        ``LoopCounter``'s or ``LoopHistogram``'s own ``labels`` is a dictionary look-up, called directly)."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def observe_stages(self, tokenize_ns: int, timings_ns: dict[str, int]) -> None:
        """One request's routing stages: its tokenization and the router's ``RouteDecision.timings_ns``."""
        stage = self.stage_seconds.labels
        stage("tokenize").observe(tokenize_ns * 1e-9)
        for name, ns in timings_ns.items():
            stage(name).observe(ns * 1e-9)

    def observe_batch(self, batch_ts: float) -> float:
        """A replica's batch applied: its lag observed and returned (seconds since it was published)."""
        lag = max(0.0, time.time() - batch_ts)
        self.event_lag.observe(lag)
        return lag

    def observe_response(self, response, start: float, model_name: str):
        """Time a proxied request that started at ``start`` (``time.perf_counter()``): a streamed answer's
        (router/http/messages.py ``Response.stream``) first bytes are here already (TTFT now; latency when
        its body ends), any other answer is complete."""
        now = time.perf_counter()
        latency = self.request_latency.labels(model_name)
        if response.stream is None:
            latency.observe(now - start)
            return response
        self.ttft.labels(model_name).observe(now - start)
        response.stream = _timed(response.stream, latency, start)
        return response

    def render(self) -> bytes:
        """The text exposition (format 0.0.4)."""
        return generate_latest(self.registry)



async def _timed(body, latency, start: float):
    """``body``'s chunks; observes ``latency`` once the stream ends (completed, broken or abandoned)."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        latency.observe(time.perf_counter() - start)
        await body.aclose()  # the relay's own cleanup (the upstream let go) runs now, not at collection


def _per_replica(name: str, help_text: str, by_replica: dict[str, dict[str, int]]) -> CounterMetricFamily:
    """A counter family labelled by replica and counter (a subscriber's ``last_seq`` is no counter: left out)."""
    family = CounterMetricFamily(name, help_text, labels=["replica", "counter"])
    for rid, counters in by_replica.items():
        for key, value in counters.items():
            if key != "last_seq":
                family.add_metric([rid, key], value)
    return family


def _sync_family(sync: dict) -> CounterMetricFamily:
    """The sync stream's counters: this router's (peer "") and each other router's it follows (peer: its endpoint)."""
    family = CounterMetricFamily("kvmesh_router_sync", "Choices on the stream between routers: published, "
                                 "send_dropped, applied, unknown_replica, overflow, and the requests that waited for "
                                 "this router's turn to decide and the seconds they waited (turn_waits, "
                                 "turn_wait_seconds; this router's, peer \"\"); per peer followed: choices, "
                                 "bad_frames, refused, foreign_keys", labels=["peer", "counter"])
    for key in ("published", "send_dropped", "applied", "unknown_replica", "overflow", "turn_waits",
                "turn_wait_seconds"):
        family.add_metric(["", key], sync[key])
    for endpoint, counters in sync["peers"].items():
        for key, value in counters.items():
            family.add_metric([endpoint, key], value)
    return family


def _queue_tail_families(tail: dict | None) -> Iterator[GaugeMetricFamily]:
    """The queue's tail and its lift, where ``cache_aware_tokens``' ``tail_knee`` is on (routing/queue_tail.py)."""
    if tail is None:
        return
    yield GaugeMetricFamily("kvmesh_router_queue_tail", "This router's recent requests' waits over their TTFT "
                            "targets, at tail_quantile (cache_aware_tokens' tail_knee)", value=tail["tail"])
    yield GaugeMetricFamily("kvmesh_router_queue_tail_lift", "How far the queue's tail lifts the weight of queued "
                            "prefill from backlog_weight towards tail_weight (0 to 1)", value=tail["lift"])


class _StateCollector:
    """Reads the router's current state at scrape time (see ``RouterRuntime.metrics_state``)."""

    def __init__(self, source: Callable[[], dict]) -> None:
        self.source = source

    def collect(self):
        state = self.source()
        g = GaugeMetricFamily("kvmesh_router_index_blocks", "Blocks held by replicas according to the index",
                              labels=["replica"])
        for rid, n in state["index_blocks"].items():
            g.add_metric([rid], n)
        yield g
        yield GaugeMetricFamily("kvmesh_router_index_keys", "Distinct router keys in the index",
                                value=state["index_keys"])
        yield CounterMetricFamily("kvmesh_router_events_applied", "KV events applied to the index",
                                  value=state["events_applied"])
        for name, help_text in (("orphan_blocks", "Stored blocks dropped: parent unknown"),
                                ("unknown_removals", "Removed blocks the index did not hold")):
            yield CounterMetricFamily(f"kvmesh_router_index_{name}", help_text, value=state["index"][name])
        yield _per_replica("kvmesh_router_event_stream", "Event subscriber counters per replica", state["subscriber"])
        yield _per_replica("kvmesh_router_load_feed", "Published load updates per replica: updates (taken), refused "
                           "(malformed), throttled (dropped undecoded: a newer one came with it), bad_frames, stale "
                           "(not newer than the last applied)", state.get("load_feed", {}))
        sync = state.get("sync")
        if sync is not None:  # router/control/router_sync.py
            yield _sync_family(sync)
        yield from _queue_tail_families(state.get("queue_tail"))
        lag = GaugeMetricFamily("kvmesh_router_event_lag_last_seconds", "Lag of the last applied batch",
                                labels=["replica"])
        for rid, value in state["event_lag"].items():
            lag.add_metric([rid], value)
        yield lag
        healthy = GaugeMetricFamily("kvmesh_router_replica_healthy", "1 if the replica receives requests",
                                    labels=["replica"])
        for rid, ok in state["healthy"].items():
            healthy.add_metric([rid], 1.0 if ok else 0.0)
        yield healthy
        degraded = GaugeMetricFamily("kvmesh_router_replica_degraded",
                                     "1 while the replica's cache information is not trusted for this reason "
                                     "(routed by load only): incompatible, bad_frames, stalled, lagging, lost_events",
                                     labels=["replica", "reason"])
        for rid, causes in state.get("degraded", {}).items():
            for cause in DEGRADED_CAUSES:
                degraded.add_metric([rid, cause], 1.0 if cause in causes else 0.0)
        yield degraded
        feed = state.get("feed")
        if feed is not None:
            yield GaugeMetricFamily("kvmesh_router_event_feed_alive", "1 while the KV event feed's thread runs",
                                    value=1.0 if feed["alive"] else 0.0)
            yield CounterMetricFamily("kvmesh_router_event_feed_restarts",
                                      "Times the KV event feed was rebuilt after a crash", value=feed["restarts"])
        fields = ("in_flight", "pending_prefill_tokens", "num_running", "num_waiting", "kv_usage",
                  "queued_prefill_tokens", "host_kv_usage", "num_host_kv_blocks")
        for f in fields:
            fam = GaugeMetricFamily(f"kvmesh_router_replica_{f}",
                                    f"Replica load: {f} (router's own counters or the replica's /load)",
                                    labels=["replica"])
            for rid, load in state["loads"].items():
                fam.add_metric([rid], float(getattr(load, f)))
            yield fam
