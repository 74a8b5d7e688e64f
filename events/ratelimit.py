"""A token bucket: at most ``burst`` at once, refilled at ``rate`` per second.

The publisher's replay/snapshot socket spends three of them per request (requests, snapshots,
answer bytes), so a peer that floods it with requests it never reads costs a bounded amount of
memory and I/O-thread time instead of the engine's latency.
"""

from __future__ import annotations

import time


class TokenBucket:
    """``take(n)`` succeeds while tokens are left; ``spend(n)`` may go into debt (paid back by
    refilling before the next ``take`` succeeds)."""

    __slots__ = ("rate", "burst", "tokens", "_at")

    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"a token bucket needs a positive rate and burst, got rate={rate}, burst={burst}")
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self._at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
        self._at = now

    def available(self) -> bool:
        """True when at least one token is left (nothing taken)."""
        self._refill()
        return self.tokens >= 1

    def take(self, n: float = 1.0) -> bool:
        """Take ``n`` tokens if there are that many; False (nothing taken) otherwise."""
        self._refill()
        if self.tokens < n:
            return False
        self.tokens -= n
        return True

    def wait_s(self, n: float) -> float:
        """Seconds until ``take(n)`` could succeed (0.0: now; inf: never, ``n`` is over ``burst``)."""
        if n > self.burst:
            return float("inf")
        self._refill()
        return max(0.0, (n - self.tokens) / self.rate)

    def spend(self, n: float) -> None:
        """Take ``n`` tokens even if that leaves a debt."""
        self._refill()
        self.tokens -= n
