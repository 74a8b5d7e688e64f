"""Engine statistics for the replica's /metrics: gauges, counters and vLLM's histograms.

Per-request phases, from the timestamps the engine records on each ``Request`` (vLLM v1's definitions):

    arrival ──queue──▶ first scheduled ──prefill──▶ first token ──decode──▶ last token ─▶ finished
            <────────────────────────────── e2e latency ─────────────────────────────────────▶
                       <──────────────────────── inference ────────────────▶
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvmesh.replica.serving.metric_buckets import (
    ITERATION_TOKENS_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)

if TYPE_CHECKING:
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager
    from kvmesh.kvcache.offload import OffloadingManager
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.engine.scheduler import Scheduler
    from kvmesh.replica.interfaces import KVOffloadCounters
    from kvmesh.replica.spec_decode.drafting import SpecDecodeStats

DEFAULT_MAX_MODEL_LEN = 4096  # token-count buckets of an ``EngineStats()`` built without a model


class Histogram:
    """Cumulative-bucket histogram (exportable as a Prometheus histogram)."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # non-cumulative; the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, value: float, n: int) -> None:
        """``observe(value)`` n times (a step's decodes often share one inter-token time)."""
        self.counts[bisect.bisect_left(self.buckets, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(upper_bound, observations <= bound), ..., (inf, count)]``."""
        out, total = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


def _latency() -> Histogram:
    return Histogram(REQUEST_LATENCY_BUCKETS)


def _token_counts() -> Histogram:
    return Histogram(build_1_2_5_buckets(DEFAULT_MAX_MODEL_LEN))


@dataclass(slots=True)
class EngineStats:
    """A snapshot of one engine's state and its cumulative counters."""

    num_running: int = 0
    """Requests running in the last step."""
    num_waiting: int = 0
    """Requests waiting (new or preempted)."""
    kv_cache_usage: float = 0.0
    """Fraction of KV blocks in use (0..1)."""
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache (cumulative)."""
    prefix_cache_hits: int = 0
    """Of those, tokens found in the cache (cumulative)."""
    num_preemptions: int = 0
    """Preemptions (cumulative)."""
    num_host_kv_blocks: int = 0
    """Blocks of the host-memory tier (0: no tier)."""
    host_kv_cache_usage: float = 0.0
    """Fraction of the host tier's blocks holding content (0..1)."""
    host_prefix_cache_hits: int = 0
    """Prompt tokens found in the host tier past the device's prefix, loaded back (cumulative)."""
    kv_offload_bytes_to_host: int = 0
    """Bytes copied from the device cache to the host tier (cumulative)."""
    kv_offload_bytes_to_device: int = 0
    """Bytes loaded back from the host tier (cumulative)."""
    kv_offload_load_seconds: float = 0.0
    """Time spent loading back (cumulative; on CUDA bytes over the measured bandwidth)."""
    grammar_compiles: dict[str, float] = field(default_factory=dict)
    """The grammar compile pool's counters (engine/grammar_pool.py ``stats``; empty before its first compile)."""
    spec_decode: SpecDecodeStats | None = None
    """Speculative decoding's drafts and accepted tokens (cumulative; None: speculative decoding off)."""
    prefill_tokens_per_s: float = 0.0
    """Prompt tokens per second this engine measured on its recent steps (0: not yet)."""
    num_prompt_tokens: int = 0
    """Prompt tokens of requests that were scheduled (cumulative)."""
    num_generation_tokens: int = 0
    """Output tokens generated (cumulative)."""
    num_finished: dict[str, int] = field(default_factory=dict)
    """Finished requests per finish reason (cumulative)."""
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    """Time to first token, seconds."""
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    """Time between consecutive output tokens of a request, seconds (every gap is one observation)."""
    e2e_latency: Histogram = field(default_factory=_latency)
    """Arrival to finish of each finished request (aborted ones included), seconds."""
    queue_time: Histogram = field(default_factory=_latency)
    """Arrival to first scheduled, seconds (requests that were never scheduled are not observed)."""
    prefill_time: Histogram = field(default_factory=_latency)
    """First scheduled to first token, seconds (requests that produced a token)."""
    decode_time: Histogram = field(default_factory=_latency)
    """First token to last token, seconds (requests that produced a token)."""
    inference_time: Histogram = field(default_factory=_latency)
    """First scheduled to last token, seconds (requests that produced a token)."""
    request_tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    """Per request: decode time / (output tokens - 1), seconds (requests with 2+ output tokens)."""
    request_prompt_tokens: Histogram = field(default_factory=_token_counts)
    """Prompt length of each finished request, tokens."""
    request_generation_tokens: Histogram = field(default_factory=_token_counts)
    """Output length of each finished request, tokens."""
    request_max_tokens: Histogram = field(default_factory=_token_counts)
    """The ``max_tokens`` parameter of each finished request."""
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BUCKETS))
    """Tokens computed per engine step (prefill chunks + one per decoding request)."""

    @classmethod
    def for_model(cls, max_model_len: int) -> EngineStats:
        """Stats whose token-count buckets end at the model's context length (as vLLM's do)."""
        buckets = build_1_2_5_buckets(max_model_len)
        return cls(request_prompt_tokens=Histogram(buckets), request_generation_tokens=Histogram(buckets),
                   request_max_tokens=Histogram(buckets))

    def record_step(self, num_batched_tokens: int) -> None:
        """One engine step that ran the model on ``num_batched_tokens`` tokens."""
        self.iteration_tokens.observe(num_batched_tokens)

    def refresh(self, scheduler: Scheduler, manager: KVCacheManager, prefill_tokens_per_s: float | None,
                copier: KVOffloadCounters | None, block_size: int) -> EngineStats:
        """Its gauges read from the engine's parts (``LLMEngine.get_stats``); itself."""
        self.num_running, self.num_waiting = scheduler.num_running, scheduler.num_waiting
        self.kv_cache_usage = manager.usage
        self.prefix_cache_queries = manager.prefix_cache_stats.queries
        self.prefix_cache_hits = manager.prefix_cache_stats.hits
        self.num_preemptions = scheduler.num_preemptions
        self.spec_decode = None if scheduler.drafter is None else scheduler.drafter.stats
        self.prefill_tokens_per_s = prefill_tokens_per_s or 0.0
        if manager.offload is not None and copier is not None:
            self.record_host_tier(manager.offload, copier, block_size)
        return self

    def record_host_tier(self, offload: OffloadingManager, copier: KVOffloadCounters, block_size: int) -> None:
        """The host tier's gauges and counters, read from its policy half and its copies."""
        self.num_host_kv_blocks = offload.host.num_blocks
        self.host_kv_cache_usage = offload.host.usage()
        self.host_prefix_cache_hits = offload.stats.hit_blocks * block_size
        self.kv_offload_bytes_to_host = copier.bytes_stored
        self.kv_offload_bytes_to_device = copier.bytes_loaded
        self.kv_offload_load_seconds = copier.load_seconds

    def record_finished(self, request: Request) -> None:
        """Observe a finished ``Request``'s phases and sizes (its timestamps are ``time.monotonic()``)."""
        reason = request.status.finish_reason or "unknown"
        self.num_finished[reason] = self.num_finished.get(reason, 0) + 1
        arrival, scheduled = request.arrival_time, request.first_scheduled_time
        first, last = request.first_token_time, request.last_token_time
        self.e2e_latency.observe(max(0.0, request.finished_time - arrival))
        self.request_prompt_tokens.observe(request.num_prompt_tokens)
        self.request_generation_tokens.observe(request.num_output_tokens)
        self.request_max_tokens.observe(request.sampling_params.max_tokens)
        if scheduled is None:
            return
        self.queue_time.observe(max(0.0, scheduled - arrival))
        if first is None or last is None:
            return
        self.prefill_time.observe(max(0.0, first - scheduled))
        self.decode_time.observe(last - first)
        self.inference_time.observe(last - scheduled)
        if request.num_output_tokens > 1:
            self.request_tpot.observe((last - first) / (request.num_output_tokens - 1))
