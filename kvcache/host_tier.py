"""The host tier: a second, larger pool of KV blocks in host memory below the device's own cache.

vLLM's OffloadingConnector in kvmesh's shape. Every block the device pool caches is copied down
(write-through), so a block the device later evicts can come back with a host-to-device copy
instead of a recompute. The tier is a ``BlockPool`` of its own (its own eviction policy, its own
events with vLLM's ``medium="CPU"``); what it adds is the in-flight state of a copy::

    device block cached ──reserve──▶ host block, ref_cnt 1, not findable (copy in flight)
                                        │ the runner reports the copy done
                                        ▼
                         commit: findable, BlockStored(medium="CPU"), free (LRU order)

A host block is findable only once its copy landed, so it is never read while the copy is in
flight. Load-backs need no such state: they run on the same copy stream as the stores, so a host
block recycled for a later store is overwritten only after the load that read it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvmesh.events.schema import HOST_MEDIUM, KVEvent
from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.block_pool import BlockPool
from kvmesh.kvcache.eviction import EvictionPolicyKwargs
from kvmesh.kvcache.hashing import BlockHash


class HostTier:
    """Host-memory blocks ``1..num_blocks-1`` (block 0 is the pool's null block); see the module doc."""

    def __init__(self, num_blocks: int, block_size: int,
                 event_sink: Callable[[KVEvent], None] | None = None, eviction_policy: str = "lru",
                 eviction_policy_kwargs: EvictionPolicyKwargs | None = None):
        self.pool = BlockPool(num_blocks, block_size, True, event_sink, eviction_policy, HOST_MEDIUM,
                              eviction_policy_kwargs)
        self.in_flight: dict[BlockHash, KVCacheBlock] = {}
        """Hash -> the host block its copy is being written into (not findable yet)."""

    @property
    def num_blocks(self) -> int:
        """Usable host blocks (the pool's null block aside)."""
        return self.pool.num_blocks - 1

    def holds(self, block_hash: BlockHash) -> bool:
        """Whether the tier has, or is receiving, a copy of this content."""
        return block_hash in self.pool.cached_block_hash_to_block or block_hash in self.in_flight

    def lookup(self, block_hashes: Sequence[BlockHash], start: int, stop: int) -> list[KVCacheBlock]:
        """The host blocks of ``block_hashes[start:stop]``, as far as they run unbroken."""
        get = self.pool.cached_block_hash_to_block.get
        found: list[KVCacheBlock] = []
        for i in range(start, stop):
            block = get(block_hashes[i])
            if block is None:
                break
            found.append(block)
        return found

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A load-back read these blocks: they become the most recently used (the chain's tail evicted
        first, as the device pool frees a request's blocks)."""
        self.pool.touch(blocks)
        self.pool.free_blocks(reversed(blocks))

    def reserve(self, sources: Sequence[KVCacheBlock]) -> list[KVCacheBlock]:
        """Host blocks for copies of the cached device blocks ``sources`` (content the tier does not
        hold yet), evicting the tier's least valuable blocks; one per source, in order. The tier may
        be smaller than the request: then only the first ``num_free`` sources get a block."""
        pool = self.pool
        n = min(len(sources), pool.get_num_free_blocks())
        targets = pool.get_new_blocks(n) if n else []
        for source, target in zip(sources, targets, strict=False):
            target.parent_block_hash = source.parent_block_hash
            target.token_ids = source.token_ids
            target.extra_keys = source.extra_keys
            target.lora_name = source.lora_name
            self.in_flight[source.block_hash] = target
        return targets

    def commit(self, sources: Sequence[KVCacheBlock], targets: Sequence[KVCacheBlock]) -> None:
        """The copies of ``sources`` into ``targets`` landed: the targets become findable (BlockStored
        with medium "CPU") and free, tail first in the eviction order."""
        pool = self.pool
        stored: list[KVCacheBlock] = []
        for source, target in zip(sources, targets, strict=True):
            h = source.block_hash
            del self.in_flight[h]
            target.block_hash = h
            pool.cached_block_hash_to_block[h] = target
            stored.append(target)
        if pool.event_sink is not None and stored:
            pool.emit_stored(stored)
        pool.free_blocks(reversed(targets))  # a chain's tail is evicted before its head

    def cancel(self, sources: Sequence[KVCacheBlock], targets: Sequence[KVCacheBlock]) -> None:
        """The copies of ``sources`` will never land: their targets go back unfindable and free."""
        for source, target in zip(sources, targets, strict=True):
            del self.in_flight[source.block_hash]
            target.reset_hash()
        self.pool.free_blocks(targets)

    def snapshot_events(self) -> list:
        """The tier's findable blocks as BlockStored chains with medium "CPU"."""
        return self.pool.snapshot_events()

    def usage(self) -> float:
        """Fraction of the tier's blocks that hold content (findable or in flight)."""
        return (len(self.pool.cached_block_hash_to_block) + len(self.in_flight)) / self.num_blocks
