"""The KV cache manager: the scheduler's view of the cache (vLLM v1's ``KVCacheManager``).

For each request it keeps the block table (``req_to_blocks``), how many of its blocks are cached
(``num_cached_block``) and its incremental block hasher. ``get_computed_blocks`` finds the longest
cached prefix; ``allocate_slots`` reserves blocks for a step (or returns None so the scheduler can
preempt) and caches the blocks the step fills; ``free`` returns a request's blocks tail first.

With a host tier (``num_host_blocks``; kvcache/host_tier.py) a prefix continues past the device's
own blocks into the tier: those blocks get fresh device blocks and are loaded back before the
step's forward, and every block the device caches is copied down after it (kvcache/offload.py).
``take_offload_copies`` hands the step's copies to the runner.

A request is any ``CacheRequest`` (kvcache/interfaces.py).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from kvmesh.events.schema import DEVICE_MEDIUM, KVEvent
from kvmesh.kvcache.block_pool import BlockPool, KVCacheBlock
from kvmesh.kvcache.eviction import EvictionPolicyKwargs
from kvmesh.kvcache.hashing import RequestBlockHasher, generate_seed, make_none_hash
from kvmesh.kvcache.host_tier import HostTier
from kvmesh.kvcache.interfaces import CacheRequest
from kvmesh.kvcache.offload import OffloadingManager
from kvmesh.kvcache.offload_copies import OffloadCopies
from kvmesh.kvcache.pool_integrity import (
    FULL_CHECK_MAX_BLOCKS,
    check_pool_integrity,
    check_pool_window,
    sweep_window,
)
from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.kvcache.stats import PrefixCacheStats

MAX_REMEMBERED_FREED = 65_536
"""Default number of recently freed request ids remembered to detect a double free."""


class KVCacheManager:
    """Prefix-cached block allocation for the scheduler; see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, hash_seed: bytes | str | None,
                 enable_caching: bool = True, event_sink: Callable[[KVEvent], None] | None = None,
                 eviction_policy: str = "lru", medium: str | None = DEVICE_MEDIUM,
                 eviction_policy_kwargs: EvictionPolicyKwargs | None = None,
                 max_remembered_freed: int = MAX_REMEMBERED_FREED, debug: bool = False,
                 num_host_blocks: int = 0, held_elsewhere: Callable[[], list[KVCacheBlock]] | None = None):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, block_size, enable_caching, event_sink, eviction_policy,
                                    medium, eviction_policy_kwargs)
        self.offload: OffloadingManager | None = None
        """The host tier's planner (None without a host tier)."""
        if num_host_blocks > 1 and enable_caching:
            host = HostTier(num_host_blocks, block_size, event_sink, eviction_policy, eviction_policy_kwargs)
            self.offload = OffloadingManager(self.block_pool, host)
        self._host_hits: dict[str, list[KVCacheBlock]] = {}
        """Host blocks ``get_computed_blocks`` found for a request, loaded by its next ``allocate_slots``."""
        self.none_hash = make_none_hash(generate_seed() if hash_seed is None else hash_seed)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        """Block table of each running request."""
        self.num_cached_block: dict[str, int] = {}
        """How many leading blocks of each request are cached (hashed and in the map)."""
        self.req_to_hasher: dict[str, RequestBlockHasher] = {}
        """Each known request's incremental hasher (created on first sight, dropped on free)."""
        self.prefix_cache_stats = PrefixCacheStats()
        """Lookups, queried tokens and hit tokens."""
        self._recently_freed: OrderedDict[str, None] = OrderedDict()
        self._max_remembered_freed = max_remembered_freed
        self.debug = debug
        """Check the invariants after each allocation and free (``check_integrity``: tests only)."""
        self._sweep_start = 1
        """Where the next windowed integrity check of a large pool starts (a block id)."""
        self.held_elsewhere = held_elsewhere
        """Device blocks held outside any block table (the engine's KV connectors': leases and pulls in flight),
        one entry per reference, for ``check_integrity``."""

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks in use."""
        return self.block_pool.get_usage()

    def _hasher(self, request: CacheRequest) -> RequestBlockHasher:
        hasher = self.req_to_hasher.get(request.request_id)
        if hasher is None:
            hasher = RequestBlockHasher(self.block_size, self.none_hash,
                                        request.cache_salt, request.lora_name, request.lora_identity)
            self.req_to_hasher[request.request_id] = hasher
            self._recently_freed.pop(request.request_id, None)
        hasher.extend(request.all_token_ids)
        return hasher

    def get_computed_blocks(self, request: CacheRequest) -> tuple[list[KVCacheBlock], int]:
        """The request's longest cached prefix and its length in tokens.

        Capped at ``num_tokens - 1`` tokens: the last prompt token must be computed again so the
        forward pass produces logits to sample from. A request with ``skip_reading_prefix_cache`` (it
        asks prompt logprobs, which need every prompt position's logits) gets no hit, as in vLLM.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        hashes = self._hasher(request).block_hashes
        get = self.block_pool.cached_block_hash_to_block.get
        computed: list[KVCacheBlock] = []
        max_blocks = min(len(hashes), reusable_blocks(request.num_tokens, self.block_size))
        for i in range(max_blocks):
            block = get(hashes[i])
            if block is None:
                break
            computed.append(block)
        num_computed_tokens = len(computed) * self.block_size
        self.prefix_cache_stats.record(request.num_tokens, num_computed_tokens)
        if self.offload is not None:
            host = self.offload.lookup(hashes, len(computed), max_blocks)
            self._host_hits[request.request_id] = host
            num_computed_tokens += len(host) * self.block_size
        return computed, num_computed_tokens

    def allocate_slots(self, request: CacheRequest, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Sequence[KVCacheBlock] | None = None
                       ) -> list[KVCacheBlock] | None:
        """Reserves blocks for ``num_new_tokens`` more tokens; None when the pool cannot fit them.

        ``new_computed_blocks`` (from ``get_computed_blocks``, first allocation only) are touched
        and prepended to the block table. Blocks the step fills completely are cached and announced
        with BlockStored. Returns the newly allocated blocks.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        rid = request.request_id
        new_computed_blocks = new_computed_blocks or ()
        host_hits = self._host_hits.pop(rid, None) if self._host_hits else None
        req_blocks = self.req_to_blocks.get(rid)
        num_existing = len(req_blocks) if req_blocks is not None else 0
        num_tokens_need_slot = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_required_blocks = -(-num_tokens_need_slot // self.block_size)
        num_new_blocks = num_required_blocks - num_existing - len(new_computed_blocks)
        pool = self.block_pool
        # Touching a free cached block takes it out of the free queue, so it cannot be counted twice.
        num_evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > pool.get_num_free_blocks() - num_evictable:
            return None
        if req_blocks is None:
            req_blocks = self.req_to_blocks[rid] = []
            self._recently_freed.pop(rid, None)
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block.setdefault(rid, len(req_blocks))
        new_blocks = pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)
        if host_hits and num_new_computed_tokens:
            self.offload.plan_loads(host_hits, new_blocks[:len(host_hits)])
        if self.enable_caching:
            num_full_blocks = min(num_tokens_need_slot, request.num_tokens) // self.block_size
            num_cached = self.num_cached_block.get(rid, 0)
            if num_full_blocks > num_cached:
                hasher = self._hasher(request)
                pool.cache_full_blocks(req_blocks, hasher.block_hashes, num_cached, num_full_blocks,
                                       request.all_token_ids, hasher.extra_keys,
                                       request.lora_name)
                self.num_cached_block[rid] = num_full_blocks
                if self.offload is not None:
                    self.offload.plan_stores(req_blocks[num_cached:num_full_blocks])
        if self.debug:
            self.check_integrity()
        return new_blocks

    def free(self, request: CacheRequest) -> None:
        """Releases the request's blocks, tail first (its last blocks are evicted first)."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None)
        self.num_cached_block.pop(rid, None)
        self._host_hits.pop(rid, None)
        self.req_to_hasher.pop(rid, None)
        if blocks is None:
            if rid in self._recently_freed:
                raise ValueError(f"request {rid!r} was already freed; free each request once")
            return  # never allocated (e.g. aborted while waiting): nothing to release
        self.block_pool.free_blocks(reversed(blocks))
        freed = self._recently_freed
        freed[rid] = None
        if len(freed) > self._max_remembered_freed:
            freed.popitem(last=False)
        if self.debug:
            self.check_integrity()

    def take_offload_copies(self) -> OffloadCopies | None:
        """The copies the steps scheduled since the last call need (None without any)."""
        return None if self.offload is None else self.offload.take()

    def complete_offload_stores(self, job_ids: list[int]) -> None:
        """The runner saw these steps' copies down land: they become findable in the host tier."""
        if self.offload is not None and job_ids:
            self.offload.complete(job_ids)

    def snapshot_events(self) -> list:
        """Every cached block of both tiers as BlockStored chains (device "GPU" first, then host "CPU")."""
        events = self.block_pool.snapshot_events()
        if self.offload is not None:
            events += self.offload.host.snapshot_events()
        return events

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as block ids."""
        return [block.block_id for block in self.req_to_blocks.get(request_id, ())]

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block of both tiers; False (nothing done) while any request holds blocks
        or a copy to the host tier is in flight."""
        if self.offload is not None and self.offload.pending:
            return False
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.offload is not None:
            self.offload.host.pool.reset_prefix_cache()
        return True

    def reset_unreferenced(self) -> int:
        """``POST /reset_prefix_cache``: the whole cache when nothing holds a block (``reset_prefix_cache``:
        AllBlocksCleared, as vLLM), else every cached block no request holds (BlockRemoved), on the host tier
        too unless a copy to it is in flight. Returns how many device blocks stopped being cached."""
        num_cached = len(self.block_pool.cached_block_hash_to_block)
        if self.reset_prefix_cache():
            return num_cached
        if self.offload is not None and not self.offload.pending:
            self.offload.host.pool.evict_unreferenced()
        return self.block_pool.evict_unreferenced()

    def cancel_offload_copies(self, job_ids: list[int]) -> None:
        """These steps' copies will never run (the runner failed them): release what they hold."""
        if self.offload is not None:
            self.offload.cancel(job_ids)

    def check_integrity(self, full: bool | None = None) -> None:
        """Raises AssertionError if a pool or block-table invariant is broken.

        ``full`` walks every block and the whole free queue; the default does so for pools of up to
        ``FULL_CHECK_MAX_BLOCKS``. Otherwise the cost is the blocks the requests hold, the cached blocks
        and one window of the pool that moves on with every call (pool_integrity.py), so a check per
        engine step stays cheap on a GPU-sized pool and still reaches every block.
        """
        pool = self.block_pool
        if full is None:
            full = pool.num_blocks <= FULL_CHECK_MAX_BLOCKS
        if full:
            check_pool_integrity(pool)
        refs: Counter[int] = Counter()
        if self.held_elsewhere is not None:
            refs.update(b.block_id for b in self.held_elsewhere())
        if self.offload is not None:
            refs.update(b.block_id for b in self.offload.held_device_blocks())
            if full:
                check_pool_integrity(self.offload.host.pool)
        for rid, blocks in self.req_to_blocks.items():
            for block in blocks:
                assert not block.is_null, f"request {rid!r} holds the null block"
                refs[block.block_id] += 1
            num_cached = self.num_cached_block.get(rid, 0)
            assert num_cached <= len(blocks), f"request {rid!r}: {num_cached} cached of {len(blocks)}"
            if num_cached and self.enable_caching:
                hashes = self.req_to_hasher[rid].block_hashes
                for block, h in zip(blocks[:num_cached], hashes, strict=False):
                    assert block.block_hash in (None, h), f"request {rid!r}: {block} has a foreign hash"
        if full:
            checked = pool.blocks[1:]
        else:
            window, self._sweep_start = sweep_window(pool, self._sweep_start)
            checked = window + [pool.blocks[i] for i in refs]
            check_pool_window(pool, checked)
            num_free = pool.get_num_free_blocks()
            assert len(refs) + num_free == pool.num_blocks - 1, (
                f"{len(refs)} blocks held by requests + {num_free} free != {pool.num_blocks - 1} usable blocks: "
                "a block is lost (referenced by no request, yet not free) or counted twice")
        for block in checked:
            assert block.ref_cnt == refs[block.block_id], (
                f"{block}: ref_cnt {block.ref_cnt} but {refs[block.block_id]} block tables hold it")
