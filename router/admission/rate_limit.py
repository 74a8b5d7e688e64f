"""A tenant's token-rate limit: a token bucket over prompt + output tokens.

The bucket holds at most ``burst`` tokens and refills at ``rate`` per second. A request is let in when
the bucket holds its prompt tokens (what is known at arrival); its output tokens are taken when it
finishes and may leave the bucket below zero, so a tenant that spent more than it had waits until the
debt is refilled. The state is two numbers, ``(level, at)``: a ledger keeps them (ledger.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class TokenRate:
    """A token-rate limit: ``tokens_per_s`` refill, ``burst_tokens`` capacity."""

    tokens_per_s: float
    """Prompt + output tokens per second the tenant may use on average."""
    burst_tokens: float
    """Tokens the tenant may use at once after being idle (the bucket's size)."""

    def __post_init__(self) -> None:
        if not self.tokens_per_s > 0 or not self.burst_tokens > 0:
            raise ValueError(f"a token-rate limit needs tokens_per_s > 0 and burst_tokens > 0, got "
                             f"{self.tokens_per_s}, {self.burst_tokens}")


def refilled(level: float, at: float, now: float, limit: TokenRate) -> float:
    """The bucket's level at ``now`` (it was ``level`` at ``at``)."""
    return min(limit.burst_tokens, level + max(0.0, now - at) * limit.tokens_per_s)


def wait_for(level: float, tokens: float, limit: TokenRate) -> float:
    """Seconds until a bucket at ``level`` holds ``tokens`` (0 when it does; a request larger than the bucket
    waits for a full bucket)."""
    need = min(tokens, limit.burst_tokens) - level
    return 0.0 if need <= 0 else need / limit.tokens_per_s
