"""The single-pool ceiling, live: what hit rate the traffic this router routes would get from one pool holding the
fleet's blocks, and where each prompt token the fleet missed went.

A ghost of that pool replays each answered request (after its answer reported its cached tokens, off the
request's path): an LRU of router keys, keys only, as many entries as the fleet has KV blocks (the sum of the
replicas' ``/load`` ``num_kv_blocks``, less each one's null block). As the engine's pool does (``KVCacheManager``,
kvcache/), a request takes its longest cached prefix (all blocks but the last token's, ``kvcache.reuse``), holds
as many blocks as its prompt and output need (evicting the least recently freed), and frees them tail first: the
output's and the partial block's entries are blanks (their content is never looked up), the prompt's full blocks
go back most recently used, its first block last. The ghost's hits over the prompt tokens are the ceiling
(``kvmesh sim``'s single-pool ceiling of the same traffic and capacity); the reported hits over them, the share.

Each missed prompt token is counted once, in this order:

    stale_index   the router predicted the chosen replica held it, and it did not
    routed_away   another replica held it (the receipt's best candidate), the request went elsewhere
    evicted       seen before (in the ghost or among the keys it evicted lately), held by no replica
    no_reuse      never seen (or seen longer ago than the ghost remembers), or never reusable (the last token's)

Memory: the ghost (one entry per fleet block) and at most as many evicted keys. Nothing here imports torch.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvmesh.kvcache.reuse import reusable_blocks

MISS_KINDS = ("stale_index", "routed_away", "evicted", "no_reuse")
"""How a missed prompt token is classified (see above), in the order it is tried."""
_BLANK_BASE = 1 << 64
"""Blank entries are numbered from here: above every router key (64-bit)."""


@dataclass(slots=True)
class CeilingTotals:
    """Token counts over the requests observed."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    """Cached prompt tokens the replicas reported."""
    ceiling_tokens: int = 0
    """Prompt tokens the single pool would have had cached."""
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MISS_KINDS, 0))
    """Missed prompt tokens by kind (``MISS_KINDS``)."""
    replay_s: float = 0.0
    """CPU seconds (of the observing thread) the replays took."""

    @property
    def share(self) -> float:
        """Reported hits over the ceiling's (0 before a ceiling hit)."""
        return self.hit_tokens / self.ceiling_tokens if self.ceiling_tokens else 0.0

    @property
    def ceiling_hit_rate(self) -> float:
        """The single pool's hit rate over the prompt tokens observed."""
        return self.ceiling_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "hit_tokens": self.hit_tokens,
                "ceiling_tokens": self.ceiling_tokens, "ceiling_hit_rate": self.ceiling_hit_rate,
                "share_of_ceiling": self.share, "miss_tokens": dict(self.misses),
                "replay_us_per_request": 1e6 * self.replay_s / self.requests if self.requests else 0.0}


def classify_misses(num_prompt_tokens: int, cached: int, predicted: int, best: int, seen: int) -> dict[str, int]:
    """The prompt's missed tokens by kind: each kind takes what the levels before it left (see the module)."""
    out, level = {}, min(max(0, cached), num_prompt_tokens)
    for kind, reach in (("stale_index", predicted), ("routed_away", best), ("evicted", seen)):
        reach = min(reach, num_prompt_tokens)
        out[kind] = max(0, reach - level)
        level = max(level, reach)
    out["no_reuse"] = num_prompt_tokens - level
    return out


class LiveCeiling:
    """The ghost pool and the totals (thread-safe; ``observe`` once per answered request)."""

    def __init__(self, block_size: int, capacity_blocks: Callable[[], int]) -> None:
        """``capacity_blocks``: the fleet's usable KV blocks now (read at each observation; 0: none known yet,
        nothing is counted)."""
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.totals = CeilingTotals()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        """Keys and blanks in the order the pool would evict them (oldest first)."""
        self._evicted: OrderedDict[int, None] = OrderedDict()
        """Keys the ghost evicted lately, at most ``capacity`` (what ``evicted`` counts as seen)."""
        self._blanks = itertools.count(_BLANK_BASE)
        self._lock = threading.Lock()

    def observe(self, keys: Sequence[int], num_prompt_tokens: int, num_output_tokens: int, cached_tokens: int,
                predicted_tokens: int, best_tokens: int) -> None:
        """One answered request: its prompt's block keys (full blocks), lengths, the cached tokens its replica
        reported, and the router's prediction and best candidate's hit when it routed it."""
        capacity = self.capacity_blocks()
        if capacity <= 0 or num_prompt_tokens <= 0:
            return
        with self._lock:
            t0 = time.thread_time()
            ceiling, seen = self._replay(keys, num_prompt_tokens, num_output_tokens, capacity)
            t = self.totals
            t.replay_s += time.thread_time() - t0
            t.requests += 1
            t.prompt_tokens += num_prompt_tokens
            t.hit_tokens += min(cached_tokens, num_prompt_tokens)
            t.ceiling_tokens += ceiling
            for kind, n in classify_misses(num_prompt_tokens, cached_tokens, predicted_tokens, best_tokens,
                                           seen).items():
                t.misses[kind] += n

    def _replay(self, keys: Sequence[int], prompt: int, output: int, capacity: int) -> tuple[int, int]:
        """The request through the ghost pool: (its hit tokens there, its tokens seen before)."""
        bs, ghost, evicted = self.block_size, self._ghost, self._evicted
        full = keys[: prompt // bs]
        matched = 0
        while matched < len(full) and full[matched] in ghost:
            matched += 1
        seen = matched
        while seen < len(full) and full[seen] in evicted:
            seen += 1
        reusable = reusable_blocks(prompt, bs)
        taken = min(matched, reusable)
        for key in full[:taken]:
            del ghost[key]
        held = min(capacity, math.ceil((prompt + output) / bs))
        while ghost and len(ghost) + held > capacity:
            key, _ = ghost.popitem(last=False)
            if key < _BLANK_BASE:
                evicted[key] = None
                evicted.move_to_end(key)
        while len(evicted) > capacity:
            evicted.popitem(last=False)
        fresh = [k for k in full[taken:held] if k not in ghost]  # a key still cached keeps its place
        for _ in range(held - taken - len(fresh)):  # freed tail first: output, partial and duplicate blocks
            ghost[next(self._blanks)] = None
        for key in reversed([*full[:taken], *fresh]):
            evicted.pop(key, None)
            ghost[key] = None
        return taken * bs, min(seen, reusable) * bs

    def summary(self) -> dict:
        """JSON-ready totals and the ghost's size."""
        with self._lock:
            return self.totals.as_dict() | {"ghost_blocks": len(self._ghost), "capacity_blocks": self.capacity_blocks()}
