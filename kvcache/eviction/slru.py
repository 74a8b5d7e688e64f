"""Segmented LRU: a probation and a protected free queue, so one-off prompts cannot flush hot prefixes.

Why SLRU rather than S3-FIFO, ARC or LRU-K: it needs nothing but two of the intrusive free queues
the pool already has (O(1) pop, append and middle removal, no allocation), no ghost lists of
evicted hashes (S3-FIFO, ARC) and no priority queue over access times (LRU-K, O(log n)). It keeps
exactly the property a prefix cache needs: a block that was *reused* at least once (a shared
system prompt, a conversation's history) survives any burst of blocks that were used once.

::

    freed, never hit --> [ probation  (evicted first) ] <-- demoted when protected overflows
    freed, hit >= k  --> [ protected  (evicted only when probation is empty) ]

The protected segment is capped at ``protected_fraction`` of the pool's blocks; beyond that its
least recently freed blocks are demoted to the probation tail (and must earn a hit again), so
yesterday's hot prefix does not pin the cache forever.
"""

from __future__ import annotations

from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.eviction.segmented import SegmentedEvictionPolicy


class SLRUEvictionPolicy(SegmentedEvictionPolicy):
    """Frequency-aware eviction: blocks hit ``promote_after_hits`` times go to the protected segment."""

    name = "slru"

    def __init__(self, blocks: list[KVCacheBlock], num_blocks: int, protected_fraction: float = 0.8,
                 promote_after_hits: int = 1):
        if not 0.0 < protected_fraction < 1.0:
            raise ValueError(f"protected_fraction must be in (0, 1), got {protected_fraction}")
        if promote_after_hits < 1:
            raise ValueError(f"promote_after_hits must be >= 1, got {promote_after_hits}")
        self.promote_after_hits = promote_after_hits
        self.protected_capacity = max(1, int(protected_fraction * (num_blocks - 1)))
        """Most free blocks the protected segment holds before it demotes its oldest."""
        super().__init__(blocks)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        from_probation = min(n, self.probation.num_free_blocks)
        out = self.probation.popleft_n(from_probation)
        if n > from_probation:
            rest = self.protected.popleft_n(n - from_probation)
            for block in rest:
                block.protected = False
            out += rest
        return out

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        k = self.promote_after_hits
        hot = [b for b in blocks if b.hit_count >= k and b.block_hash is not None]
        if not hot:
            cold = blocks
        elif len(hot) == len(blocks):
            cold = []
        else:
            cold = [b for b in blocks if b.hit_count < k or b.block_hash is None]
        self.probation.append_n(cold)
        if not hot:
            return
        for block in hot:
            block.protected = True
        self.protected.append_n(hot)
        overflow = self.protected.num_free_blocks - self.protected_capacity
        if overflow > 0:
            demoted = self.protected.popleft_n(overflow)
            for block in demoted:
                block.protected = False
                block.hit_count = 0
            self.probation.append_n(demoted)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return self.probation.get_all_free_blocks() + self.protected.get_all_free_blocks()
