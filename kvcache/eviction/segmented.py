"""The two free queues SLRU and ARC keep: probation (freed, never hit) and protected (hit before).

A free block sits in exactly one of them; ``KVCacheBlock.protected`` says which. What the policies
share is kept here: the queues, the count, removing a revived block, and a reset that makes every
block a probation block again. When to evict from which segment is each policy's own.
"""

from __future__ import annotations

from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.eviction.base import EvictionPolicy
from kvmesh.kvcache.free_queue import FreeKVCacheBlockQueue


class SegmentedEvictionPolicy(EvictionPolicy):
    """A probation and a protected free queue; subclasses decide the order between them."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.probation = FreeKVCacheBlockQueue(blocks)
        """Free blocks never hit (or demoted), evicted first by default."""
        self.protected = FreeKVCacheBlockQueue()
        """Free blocks that were hit, kept while probation has victims to give."""
        for block in blocks:
            block.protected = False

    @property
    def num_free_blocks(self) -> int:
        return self.probation.num_free_blocks + self.protected.num_free_blocks

    def remove(self, block: KVCacheBlock) -> None:
        (self.protected if block.protected else self.probation).remove(block)
        block.protected = False

    def reset(self) -> None:
        blocks = self.protected.popleft_n(self.protected.num_free_blocks)
        for block in blocks:
            block.protected = False
        self.probation.append_n(blocks)
