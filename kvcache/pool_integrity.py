"""Invariants of a block pool, checked in tests and in debug mode (O(num_blocks))."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.kvcache.block_pool import BlockPool


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
    for h, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == h, f"map entry {h.hex()[:8]} points at {block}"
    if not pool.enable_caching:
        assert not pool.cached_block_hash_to_block, "caching is disabled but blocks are cached"
