"""LRU with vLLM v1's semantics: one free queue; freed blocks join the tail in the order given."""

from __future__ import annotations

from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.eviction.base import EvictionPolicy
from kvmesh.kvcache.free_queue import FreeKVCacheBlockQueue


class LRUEvictionPolicy(FreeKVCacheBlockQueue, EvictionPolicy):
    """The least recently freed block is evicted first.

    The manager frees a request's blocks tail first, so a request's last blocks are evicted
    before its (more shareable) first blocks. A hit on a free block pulls it out of the queue.
    """

    name = "lru"

    def __init__(self, blocks: list[KVCacheBlock], num_blocks: int):
        super().__init__(blocks)
