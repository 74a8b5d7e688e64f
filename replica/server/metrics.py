"""Prometheus ``/metrics`` of one replica, with vLLM's metric names, labels and buckets.

The engine keeps its own cumulative ``EngineStats`` (stats.py); this module turns a snapshot of
them into Prometheus families at scrape time (a custom collector on a private registry, so two
replicas in one process never clash). Every ``vllm:*`` family carries vLLM v1's labels
``model_name`` (the served model name) and ``engine`` ("0": one engine core per replica).

    vllm:num_requests_running / _waiting                  gauge
    vllm:kv_cache_usage_perc (+ deprecated gpu_cache_usage_perc)   gauge, 0..1
    vllm:cache_config_info{block_size, num_gpu_blocks, ...}        gauge = 1 (an info metric)
    vllm:prefix_cache_queries / _hits (+ deprecated gpu_*)         counter, tokens
    vllm:num_preemptions, vllm:prompt_tokens, vllm:generation_tokens   counter
    vllm:request_success{finished_reason}                 counter
    vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds
      (+ the older vllm:time_per_output_token_seconds), vllm:request_time_per_output_token_seconds,
    vllm:e2e_request_latency_seconds, vllm:request_{queue,prefill,decode,inference}_time_seconds,
    vllm:request_prompt_tokens / _generation_tokens / _max_num_generation_tokens,
    vllm:request_params_max_tokens, vllm:iteration_tokens_total      histograms
    vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens,
    vllm:spec_decode_num_accepted_tokens_per_pos{position}, kvmesh_spec_decode_ineligible_requests
                                                          counters (only with speculative_config)
    kvmesh_http_requests{endpoint,status}                 counter (this server, ``CountMiddleware``)
    kvmesh_prefill_tokens_per_second                      gauge, measured on the engine's own steps
    the host tier (``kv_offload_memory``; zeros without one): kvmesh_host_kv_cache_usage (gauge, 0..1),
    kvmesh_host_prefix_cache_hits (counter, tokens loaded back), kvmesh_kv_offload_bytes{direction}
    and kvmesh_kv_offload_load_seconds (counters)
    kvmesh_grammar_compile_seconds (counter), kvmesh_grammar_compiles{outcome} (counter: compiled, failed,
    timed_out, cancelled), kvmesh_grammar_compiles_running / _waiting (gauges): the grammar compile pool
    process_*, python_*                                   the standard process collectors

kvmesh's own names never contain ``:`` (reserved for recording rules; promtool flags it), only
vLLM's names do, so that vLLM's dashboards and alerts work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from kvmesh.replica.engine.grammar_pool import OUTCOMES
from kvmesh.replica.openai.metrics_exposition import add_process_collectors, metrics_response
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from kvmesh.replica.engine.stats import EngineStats, Histogram
    from kvmesh.replica.spec_decode.drafting import SpecDecodeStats

StatsSource = Callable[[], "EngineStats | None"]
"""Returns a snapshot of the engine's stats (``AsyncLLM.get_stats``); None: nothing to export yet."""
CacheInfo = Mapping[str, str | int | float | bool]
"""Labels of ``vllm:cache_config_info``."""

ENGINE_INDEX = "0"  # vLLM's "engine" label: the data-parallel engine core; a replica has one

# (name, help, EngineStats attribute) of every histogram, in vLLM's words.
_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "tpot"),
    ("vllm:time_per_output_token_seconds",
     "Histogram of time per output token in seconds. DEPRECATED: use vllm:inter_token_latency_seconds.", "tpot"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     "request_tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e_latency"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue_time"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill_time"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode_time"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     "inference_time"),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "request_prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "request_generation_tokens"),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     "request_generation_tokens"),  # one sequence per engine request: its max is its own count
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "request_max_tokens"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
)


class EngineStatsCollector(Collector):
    """Reads ``stats_fn()`` (an ``EngineStats``) on every scrape and exports it."""

    def __init__(self, stats_fn: StatsSource, model_name: str, cache_info: CacheInfo | None = None):
        self.stats_fn = stats_fn
        self.labels = [model_name, ENGINE_INDEX]
        self.cache_info = {k: str(v) for k, v in (cache_info or {}).items()}

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name", "engine"])
        g.add_metric(self.labels, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name", "engine"])
        c.add_metric(self.labels, value)
        return c

    def _histogram(self, name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
        h = HistogramMetricFamily(name, doc, labels=["model_name", "engine"])
        buckets = [(_bound(b), float(n)) for b, n in hist.cumulative()]
        h.add_metric(self.labels, buckets, sum_value=hist.sum)
        return h

    def _host_tier(self, s: EngineStats) -> Iterator[Metric]:
        """The host tier's usage, hits and copies."""
        yield self._gauge("kvmesh_host_kv_cache_usage", "Fraction of the host-memory KV tier holding content.",
                          s.host_kv_cache_usage)
        yield self._counter("kvmesh_host_prefix_cache_hits",
                            "Prompt tokens found in the host tier past the device prefix and loaded back.",
                            s.host_prefix_cache_hits)
        moved = CounterMetricFamily("kvmesh_kv_offload_bytes",
                                    "Bytes copied between the device cache and the host tier.",
                                    labels=["model_name", "engine", "direction"])
        moved.add_metric([*self.labels, "to_host"], s.kv_offload_bytes_to_host)
        moved.add_metric([*self.labels, "to_device"], s.kv_offload_bytes_to_device)
        yield moved
        yield self._counter("kvmesh_kv_offload_load_seconds", "Seconds spent loading blocks back from the host tier.",
                            s.kv_offload_load_seconds)

    def _grammar(self, s: EngineStats) -> Iterator[Metric]:
        """The grammar compile pool's work (zeros before its first compile)."""
        g = s.grammar_compiles
        yield self._counter("kvmesh_grammar_compile_seconds", "Seconds grammar compile processes spent compiling.",
                            g.get("compile_seconds", 0.0))
        ended = CounterMetricFamily("kvmesh_grammar_compiles", "Grammar compiles ended, by outcome.",
                                    labels=["model_name", "engine", "outcome"])
        for outcome in OUTCOMES:
            ended.add_metric([*self.labels, outcome], g.get(outcome, 0))
        yield ended
        yield self._gauge("kvmesh_grammar_compiles_running", "Grammar compiles running now.", g.get("running", 0))
        yield self._gauge("kvmesh_grammar_compiles_waiting", "Grammar compiles waiting for a compile process.",
                          g.get("waiting", 0))

    def _spec_decode(self, sd: SpecDecodeStats) -> Iterator[Metric]:
        """vLLM's speculative decoding counters (only with ``speculative_config``)."""
        yield self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", sd.num_drafts)
        yield self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", sd.num_draft_tokens)
        yield self._counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                            sd.num_accepted_tokens)
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.",
                                      labels=["model_name", "engine", "position"])
        for pos, n in enumerate(sd.accepted_per_pos):
            per_pos.add_metric([*self.labels, str(pos)], n)
        yield per_pos
        yield self._counter("kvmesh_spec_decode_ineligible_requests",
                            "Requests decoded one token per step: their sampling settings are not verified.",
                            sd.num_ineligible)

    def collect(self) -> Iterator[Metric]:
        s = self.stats_fn()
        if s is None:
            return
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          s.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_cache_usage)
        yield self._gauge("vllm:gpu_cache_usage_perc",
                          "KV-cache usage. 1 means 100 percent usage. DEPRECATED: use vllm:kv_cache_usage_perc.",
                          s.kv_cache_usage)
        if self.cache_info:
            info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                     labels=[*self.cache_info, "engine"])
            info.add_metric([*self.cache_info.values(), ENGINE_INDEX], 1.0)
            yield info
        for prefix in ("", "gpu_"):
            note = " DEPRECATED: use vllm:prefix_cache_queries / _hits." if prefix else ""
            yield self._counter(f"vllm:{prefix}prefix_cache_queries",
                                "Prefix cache queries, in terms of number of queried tokens." + note,
                                s.prefix_cache_queries)
            yield self._counter(f"vllm:{prefix}prefix_cache_hits",
                                "Prefix cache hits, in terms of number of cached tokens." + note, s.prefix_cache_hits)
        yield self._gauge("kvmesh_prefill_tokens_per_second",
                          "Prompt tokens per second the engine measured on its recent steps (0: not yet).",
                          s.prefill_tokens_per_s)
        yield from self._host_tier(s)  # zeros without a tier: dashboards query one set of series
        yield from self._grammar(s)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            s.num_preemptions)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.num_prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            s.num_generation_tokens)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=["model_name", "engine", "finished_reason"])
        for reason, n in sorted(s.num_finished.items()):
            success.add_metric([*self.labels, reason], n)
        yield success
        if s.spec_decode is not None:
            yield from self._spec_decode(s.spec_decode)
        for name, doc, attr in _HISTOGRAMS:
            yield self._histogram(name, doc, getattr(s, attr))


def _bound(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


class ReplicaMetrics:
    """The replica's private Prometheus registry: engine stats, HTTP request counts, process collectors."""

    def __init__(self, stats_fn: StatsSource, model_name: str, cache_info: CacheInfo | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineStatsCollector(stats_fn, model_name, cache_info))
        add_process_collectors(self.registry)
        self.http_requests = Counter(
            "kvmesh_http_requests", "HTTP requests served, by endpoint and status code.",
            ["endpoint", "status"], registry=self.registry,
        )

    def count_request(self, endpoint: str, status: int) -> None:
        self.http_requests.labels(endpoint, str(status)).inc()

    def render(self) -> bytes:
        """The text exposition (format 0.0.4)."""
        return generate_latest(self.registry)

    def response(self, accept: str | None) -> Response:
        """``GET /metrics``: OpenMetrics when the scraper accepts it, else the text format."""
        return metrics_response(self.registry, accept)


KNOWN_PATHS = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/health", "/ping", "/version",
    "/metrics", "/load", "/get_load", "/server_info", "/get_server_info", "/model_info", "/get_model_info",
    "/v1/completions/render", "/v1/chat/completions/render", "/kv/handshake", "/kv/lease", "/kv/release",
})
"""The endpoints counted by name; any other path is counted as "other" (a bounded label set)."""


class CountMiddleware:
    """Pure ASGI (no response buffering, unlike ``BaseHTTPMiddleware``): a per-endpoint status counter."""

    def __init__(self, app: ASGIApp, metrics: ReplicaMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        label = path if path in KNOWN_PATHS else "other"  # bounded label set, whatever clients send
        status = [500]

        async def send_counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            self.metrics.count_request(label, status[0])
