"""The request a ``KVCacheManager`` sees, written down once.

The engine's ``replica.engine.request.Request``, the simulator's ``SimRequest`` and the benchmarks'
and tests' ``TokenRequest`` all satisfy ``CacheRequest``; the manager reads nothing else.

    all_token_ids = [p0 p1 ... | o0 o1 ...]     prompt | output so far (num_tokens long)
                     <- num_computed_tokens ->   K/V already in the cache
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@runtime_checkable
class CacheRequest(Protocol):
    """What the KV cache manager reads from a request."""

    request_id: str
    """Unique among the manager's live requests; keys its block table."""
    all_token_ids: list[int]
    """Prompt then output tokens so far; only ever appended to."""
    num_computed_tokens: int
    """Leading tokens whose K/V the cache already holds (the scheduler advances it)."""
    cache_salt: str | None
    """Tenant isolation: enters block 0's extra keys, so different salts share no block."""
    lora_name: str | None
    """The LoRA adapter, part of every block's hash; None without LoRA."""
    lora_identity: str | None
    """The identity of the adapter's weights (a digest), part of every block's hash after its name; None: none."""
    skip_reading_prefix_cache: bool
    """Read no cached prefix (a request asking prompt logprobs needs every prompt position's logits)."""

    @property
    def num_tokens(self) -> int:
        """``len(all_token_ids)``."""
        ...


@dataclass(slots=True, eq=False)
class TokenRequest:
    """The smallest ``CacheRequest``: token ids and progress, nothing else (benchmarks, tools, tests)."""

    request_id: str
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    cache_salt: str | None = None
    lora_name: str | None = None
    lora_identity: str | None = None
    skip_reading_prefix_cache: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)
