"""Prefix-cache statistics, counted in tokens (as vLLM's ``PrefixCacheStats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters since the last ``reset()``; a query is one ``get_computed_blocks`` call."""

    requests: int = 0
    """Number of lookups (requests asking for their cached prefix)."""
    queries: int = 0
    """Tokens looked up (the requests' lengths)."""
    hits: int = 0
    """Tokens found in the cache (``prefix_hit_tokens``)."""

    def record(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Counts one lookup of ``num_tokens`` tokens of which ``num_hit_tokens`` hit."""
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Fraction of looked-up tokens that hit (0.0 before any lookup)."""
        return self.hits / self.queries if self.queries else 0.0

    def reset(self) -> None:
        """Zeroes every counter."""
        self.requests = self.queries = self.hits = 0
