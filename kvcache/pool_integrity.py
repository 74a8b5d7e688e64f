"""Invariants of a block pool, checked in tests and in debug mode.

``check_pool_integrity`` walks every block and the whole free queue (O(num_blocks)). A tiny model
on a large GPU holds ~750,000 blocks, and a debug check after every engine step would then cost
far more than the step, so for large pools ``check_pool_window`` checks the pool-wide invariants
that are cheap (the null block, the free count, every cached block) and the blocks of one window
in full; the caller moves the window through the pool (``sweep_window``), so every block is
examined every ``num_blocks / SWEEP_BLOCKS`` checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.kvcache.block_pool import BlockPool

FULL_CHECK_MAX_BLOCKS = 16_384
"""Pools up to this many blocks are checked block by block; larger ones window by window."""
SWEEP_BLOCKS = 1024
"""Blocks of a large pool one windowed check examines in full."""


def check_pool_integrity(pool: BlockPool) -> None:
    """Every block is either in use (ref_cnt > 0) or free (in the queue), never both; the hash map
    points only at blocks carrying that hash; the null block is never free nor cached."""
    policy = pool.eviction_policy
    free = policy.get_all_free_blocks()
    assert len(free) == policy.num_free_blocks, (
        f"free queue holds {len(free)} blocks but counts {policy.num_free_blocks}")
    free_ids = set()
    for block in free:
        assert block.block_id not in free_ids, f"{block} is twice in the free queue"
        free_ids.add(block.block_id)
        assert block.ref_cnt == 0, f"{block} is in the free queue with a reference"
        assert block.next_free_block.prev_free_block is block, f"broken free-queue link after {block}"
    null = pool.null_block
    assert null.block_id not in free_ids, "the null block is in the free queue"
    assert null.block_hash is None, "the null block carries a hash"
    for block in pool.blocks[1:]:
        assert block.ref_cnt >= 0, f"{block} has a negative ref count"
        in_queue = block.block_id in free_ids
        assert (block.ref_cnt > 0) != in_queue, f"{block}: in use={block.ref_cnt > 0}, free={in_queue}"
        if not in_queue:
            assert block.prev_free_block is None and block.next_free_block is None, (
                f"{block} is in use but still linked into a free queue")
        if block.block_hash is not None:
            assert pool.cached_block_hash_to_block.get(block.block_hash) is block, (
                f"{block} carries a hash the map does not point back from")
    _check_hash_map(pool)


def sweep_window(pool: BlockPool, start: int, count: int = SWEEP_BLOCKS) -> tuple[list[KVCacheBlock], int]:
    """``count`` usable blocks from block id ``start`` on, wrapping past the end (the null block is
    skipped), and the id the next window starts at."""
    usable = pool.num_blocks - 1
    count = min(count, usable)
    first = (start - 1) % usable
    ids = [1 + (first + i) % usable for i in range(count)]
    return [pool.blocks[i] for i in ids], 1 + (first + count) % usable


def check_pool_window(pool: BlockPool, window: list[KVCacheBlock]) -> None:
    """The pool's cheap invariants, and those of every cached block and every block in ``window``
    (O(cached blocks + window))."""
    null = pool.null_block
    assert null.prev_free_block is None and null.next_free_block is None, "the null block is in the free queue"
    assert null.block_hash is None, "the null block carries a hash"
    num_free = pool.eviction_policy.num_free_blocks
    assert 0 <= num_free <= pool.num_blocks - 1, f"the free queue counts {num_free} of {pool.num_blocks} blocks"
    for block in window:
        check_block(pool, block)
    for block in pool.cached_block_hash_to_block.values():
        check_block(pool, block)
    _check_hash_map(pool)


def check_block(pool: BlockPool, block: KVCacheBlock) -> None:
    """One block: in use and unlinked, or free and linked both ways into a free queue; a hash it carries
    is the map's."""
    assert block.ref_cnt >= 0, f"{block} has a negative ref count"
    prev, nxt = block.prev_free_block, block.next_free_block
    if block.ref_cnt > 0:
        assert prev is None and nxt is None, f"{block} is in use but still linked into a free queue"
    else:
        assert prev is not None and nxt is not None, f"{block} is free but in no free queue"
        assert prev.next_free_block is block and nxt.prev_free_block is block, f"broken free-queue link at {block}"
    if block.block_hash is not None:
        assert pool.cached_block_hash_to_block.get(block.block_hash) is block, (
            f"{block} carries a hash the map does not point back from")


def _check_hash_map(pool: BlockPool) -> None:
    for h, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == h, f"map entry {h.hex()[:8]} points at {block}"
        assert not block.is_null, "the null block is cached"
    if not pool.enable_caching:
        assert not pool.cached_block_hash_to_block, "caching is disabled but blocks are cached"
