"""Reuse totals over completed route receipts (``ReuseTotals``): cluster-wide, and one per replica on its record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REASONS = ("cache", "load", "session", "fallback")
"""Every value ``RouteReceipt.reason`` takes."""


@dataclass(slots=True)
class ReuseTotals:
    """Running sums over completed receipts (cluster-wide or of one replica)."""

    requests: int = 0
    """Receipts completed with the engine's report."""
    prompt_tokens: int = 0
    """Prompt tokens of those requests."""
    available_tokens: int = 0
    """Sum of ``best_hit_tokens``: the reuse the cluster offered at routing time."""
    predicted_tokens: int = 0
    """Sum of ``predicted_hit_tokens`` on the chosen replicas."""
    predicted_host_tokens: int = 0
    """The part of ``predicted_tokens`` predicted from host tiers."""
    captured_tokens: int = 0
    """Sum of the cached tokens the replicas reported."""
    captured_host_tokens: int = 0
    """The part of ``captured_tokens`` the replicas reported loading back from their host tiers."""
    mispredicted: int = 0
    """Requests whose reported hit differed from the prediction."""
    reasons: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    """Requests per route reason."""

    def add(self, receipt: Any, cached_tokens: int) -> None:
        """Count a completed ``RouteReceipt`` (router/routing/receipts.py)."""
        self.requests += 1
        self.prompt_tokens += receipt.num_prompt_tokens
        self.available_tokens += receipt.best_hit_tokens
        self.predicted_tokens += receipt.predicted_hit_tokens
        self.predicted_host_tokens += receipt.predicted_host_tokens
        self.captured_tokens += cached_tokens
        self.captured_host_tokens += receipt.actual_host_cached_tokens or 0
        self.mispredicted += bool(receipt.mispredicted)
        self.reasons[receipt.reason] += 1

    @property
    def captured_ratio(self) -> float:
        """Captured ÷ available reuse (1.0 when nothing was available)."""
        return self.captured_tokens / self.available_tokens if self.available_tokens else 1.0

    @property
    def mispredicted_rate(self) -> float:
        """Fraction of requests whose reported hit differed from the prediction."""
        return self.mispredicted / self.requests if self.requests else 0.0

    def as_dict(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "available_tokens": self.available_tokens, "predicted_tokens": self.predicted_tokens,
                "predicted_host_tokens": self.predicted_host_tokens,
                "captured_tokens": self.captured_tokens,
                "captured_host_tokens": self.captured_host_tokens, "captured_ratio": self.captured_ratio,
                "mispredicted": self.mispredicted, "mispredicted_rate": self.mispredicted_rate,
                "reasons": dict(self.reasons)}
