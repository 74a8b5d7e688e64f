"""Engine statistics for the replica's /metrics: gauges, counters and latency histograms."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

# Bucket upper bounds in seconds (vLLM's, Prometheus-style; +Inf is implied).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
RECENT_OBSERVATIONS = 1000  # raw samples kept per histogram, for percentiles over the recent past


class Histogram:
    """Cumulative-bucket histogram (exportable as a Prometheus histogram) plus the recent raw samples."""

    __slots__ = ("buckets", "counts", "sum", "count", "recent")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # non-cumulative; the last one is +Inf
        self.sum = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=RECENT_OBSERVATIONS)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1
        self.recent.append(value)

    def observe_many(self, value: float, n: int) -> None:
        """``observe(value)`` n times (a step's decodes often share one inter-token time)."""
        self.counts[bisect.bisect_left(self.buckets, value)] += n
        self.sum += value * n
        self.count += n
        self.recent.extend([value] * min(n, RECENT_OBSERVATIONS))

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(upper_bound, observations <= bound), ..., (inf, count)]``."""
        out, total = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100) of the recent samples, or None without samples."""
        if not self.recent:
            return None
        values = sorted(self.recent)
        return values[min(len(values) - 1, int(q / 100.0 * len(values)))]


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
    num_prompt_tokens: int = 0
    """Prompt tokens of requests that were scheduled (cumulative)."""
    num_generation_tokens: int = 0
    """Output tokens generated (cumulative)."""
    num_finished: dict[str, int] = field(default_factory=dict)
    """Finished requests per finish reason (cumulative)."""
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    """Time to first token, seconds."""
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    """Time per output token after the first, seconds."""

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
