"""The block pool: every KV cache block, the free blocks' eviction order and the prefix-cache map.

Block 0 is the null block and is never handed out. A freed block keeps its hash and stays findable
through ``cached_block_hash_to_block`` until the eviction policy hands it out again; only then is
it evicted (lazily, in ``get_new_blocks``) and a ``BlockRemoved`` emitted. Events go to the
``event_sink`` the owner supplies; the pool knows nothing of transports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvmesh.events.schema import DEVICE_MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.eviction import EvictionPolicyKwargs, make_eviction_policy
from kvmesh.kvcache.hashing import BlockHash, external_hash
from kvmesh.kvcache.snapshot import block_stored_event, snapshot_events

__all__ = ["BlockPool", "KVCacheBlock"]


class BlockPool:
    """All blocks of one KV cache, preallocated; see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 event_sink: Callable[[KVEvent], None] | None = None, eviction_policy: str = "lru",
                 medium: str | None = DEVICE_MEDIUM, eviction_policy_kwargs: EvictionPolicyKwargs | None = None):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.event_sink = event_sink
        self.medium = medium
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.eviction_policy = make_eviction_policy(
            eviction_policy, self.blocks[1:], num_blocks, **(eviction_policy_kwargs or {}))
        # Policies that learn from (re)cached content (ghost lists) get every newly cached block.
        self._on_cached = self.eviction_policy.on_cached if self.eviction_policy.wants_on_cached else None
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        """Prefix-cache map: hash -> the one block holding that content (in use or free)."""

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """``num_blocks`` blocks with ref_cnt 1; recycled ones that were cached are evicted now."""
        if num_blocks > self.eviction_policy.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} blocks: only "
                             f"{self.eviction_policy.num_free_blocks} are free")
        blocks = self.eviction_policy.popleft_n(num_blocks)
        removed: list[BlockHash] | None = None
        cached = self.cached_block_hash_to_block
        for block in blocks:
            h = block.block_hash
            if h is not None:
                if cached.get(h) is block:
                    del cached[h]
                    if removed is None:
                        removed = []
                    removed.append(h)
                # Evicted: the other cached-content fields are rewritten when it is cached again.
                block.block_hash = block.token_ids = None
                block.hit_count = 0
            block.ref_cnt = 1
        if removed and self.event_sink is not None:
            self.event_sink(BlockRemoved(block_hashes=[external_hash(h) for h in removed],
                                         medium=self.medium))
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Prefix-cache hits: take a reference; a hit on a free block pulls it out of the free queue."""
        policy = self.eviction_policy
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                policy.remove(block)
            block.ref_cnt += 1
            block.hit_count += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drops one reference per block; blocks reaching zero join the free queue in this order."""
        freed = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and block.block_id != 0:
                freed.append(block)
        self.eviction_policy.append_n(freed)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int, token_ids: Sequence[int],
                          extra_keys: Callable[[int], tuple | None] | None = None,
                          lora_name: str | None = None) -> None:
        """Caches ``blocks[num_cached_blocks:num_full_blocks]`` under their hashes; emits BlockStored.

        ``token_ids`` are the request's tokens (block ``i`` holds ``token_ids[i*bs:(i+1)*bs]``) and
        ``extra_keys(i)`` gives block ``i``'s extra hash keys. A block whose content another block
        already holds (two requests computed it in the same step) is left uncached.
        """
        if not self.enable_caching or num_full_blocks <= num_cached_blocks:
            return
        bs = self.block_size
        cached = self.cached_block_hash_to_block
        parent = block_hashes[num_cached_blocks - 1] if num_cached_blocks > 0 else None
        stored: list[KVCacheBlock] = []
        for i in range(num_cached_blocks, num_full_blocks):
            block, h = blocks[i], block_hashes[i]
            if block.block_hash is None and h not in cached:
                block.block_hash = h
                block.parent_block_hash = parent
                block.token_ids = token_ids[i * bs : (i + 1) * bs]
                block.extra_keys = extra_keys(i) if extra_keys is not None else None
                block.lora_name = lora_name
                cached[h] = block
                stored.append(block)
            parent = h
        if not stored:
            return
        if self._on_cached is not None:
            self._on_cached(stored)
        if self.event_sink is not None:
            self.emit_stored(stored)

    def emit_stored(self, stored: list[KVCacheBlock]) -> None:
        """One BlockStored per unbroken chain of newly cached blocks."""
        start = 0
        for i in range(1, len(stored)):
            if stored[i].parent_block_hash != stored[i - 1].block_hash:
                self.event_sink(block_stored_event(stored[start:i], self.block_size, self.medium))
                start = i
        self.event_sink(block_stored_event(stored[start:], self.block_size, self.medium))

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached hash; refused (False) while any block is in use."""
        num_used = self.num_blocks - 1 - self.eviction_policy.num_free_blocks
        if num_used > 0:
            return False
        for block in self.cached_block_hash_to_block.values():
            block.reset_hash()
        self.cached_block_hash_to_block.clear()
        self.eviction_policy.reset()
        if self.event_sink is not None:
            self.event_sink(AllBlocksCleared())
        return True

    def evict_unreferenced(self) -> int:
        """Evicts every cached block no request holds (one BlockRemoved); the blocks in use stay cached. A held
        block's whole prefix chain is held too, so what stays cached is still a set of unbroken chains. Returns
        how many blocks were evicted."""
        policy, cached = self.eviction_policy, self.cached_block_hash_to_block
        victims = [block for block in cached.values() if block.ref_cnt == 0]
        if not victims:
            return 0
        for block in victims:
            policy.remove(block)
            del cached[block.block_hash]
        removed = [external_hash(block.block_hash) for block in victims]
        for block in victims:
            block.block_hash = block.token_ids = None
            block.hit_count = 0
        policy.append_n(victims)  # free again, now holding nothing
        if self.event_sink is not None:
            self.event_sink(BlockRemoved(block_hashes=removed, medium=self.medium))
        return len(victims)

    def get_num_free_blocks(self) -> int:
        """Blocks that can be handed out (free, cached or not)."""
        return self.eviction_policy.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) in use."""
        return 1.0 - self.eviction_policy.num_free_blocks / (self.num_blocks - 1)

    def snapshot_events(self) -> list[BlockStored]:
        """Every cached block as BlockStored chains, parents before children.

        Call it on the engine's thread (between steps): the pool is not locked. The map is copied
        first (atomically under the GIL), so a concurrent caller gets an error-free, if possibly
        stale, answer.
        """
        return snapshot_events(dict(self.cached_block_hash_to_block), self.block_size, self.medium)
