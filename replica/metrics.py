"""Prometheus ``/metrics`` of one replica, with vLLM's metric names where the meaning is the same.

The engine keeps its own cumulative ``EngineStats``; this module turns a snapshot of them into
Prometheus families at scrape time (a custom collector on a private registry, so two replicas
in one process never clash), plus the server's own HTTP counters.

    vllm:num_requests_running / _waiting       gauge
    vllm:kv_cache_usage_perc                   gauge, 0..1 (vLLM's unit despite the name)
    vllm:prefix_cache_queries / _hits          counter, tokens
    vllm:num_preemptions                       counter
    vllm:prompt_tokens / vllm:generation_tokens counter
    vllm:request_success{finished_reason}      counter
    vllm:time_to_first_token_seconds           histogram
    vllm:inter_token_latency_seconds           histogram
    kvmesh:http_requests{endpoint,status}      counter (this server)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineStatsCollector(Collector):
    """Reads ``stats_fn()`` (an ``EngineStats``) on every scrape and exports it."""

    def __init__(self, stats_fn: Callable[[], Any], model_name: str):
        self.stats_fn = stats_fn
        self.model_name = model_name

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self.model_name], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self.model_name], value)
        return c

    def _histogram(self, name: str, doc: str, hist: Any) -> HistogramMetricFamily:
        h = HistogramMetricFamily(name, doc, labels=["model_name"])
        buckets = [(_bound(b), float(n)) for b, n in hist.cumulative()]
        h.add_metric([self.model_name], buckets, sum_value=hist.sum)
        return h

    def collect(self) -> Iterator[Any]:
        s = self.stats_fn()
        if s is None:
            return
        yield self._gauge("vllm:num_requests_running", "Requests running on the engine.", s.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to run.", s.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100%).", s.kv_cache_usage)
        yield self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                            s.prefix_cache_queries)
        yield self._counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                            s.prefix_cache_hits)
        yield self._counter("vllm:num_preemptions", "Cumulative preemptions.", s.num_preemptions)
        yield self._counter("vllm:prompt_tokens", "Prompt tokens processed.", s.num_prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Tokens generated.", s.num_generation_tokens)
        success = CounterMetricFamily("vllm:request_success", "Finished requests by finish reason.",
                                      labels=["model_name", "finished_reason"])
        for reason, n in sorted(s.num_finished.items()):
            success.add_metric([self.model_name, reason], n)
        yield success
        yield self._histogram("vllm:time_to_first_token_seconds", "Time to first token.", s.ttft)
        yield self._histogram("vllm:inter_token_latency_seconds", "Time between output tokens.", s.tpot)


def _bound(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


class ReplicaMetrics:
    """The replica's private Prometheus registry: engine stats plus HTTP request counts."""

    def __init__(self, stats_fn: Callable[[], Any], model_name: str):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineStatsCollector(stats_fn, model_name))
        self.http_requests = Counter(
            "kvmesh:http_requests", "HTTP requests served, by endpoint and status code.",
            ["endpoint", "status"], registry=self.registry,
        )

    def count_request(self, endpoint: str, status: int) -> None:
        self.http_requests.labels(endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
