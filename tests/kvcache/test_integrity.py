"""The integrity checker catches corrupted pools and block tables, walking every block of a small pool
and, on a GPU-sized pool, only what requests hold, the cached blocks and a window that sweeps the pool."""

from __future__ import annotations

import pytest
from kvmesh.kvcache import pool_integrity
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.kvcache.pool_integrity import FULL_CHECK_MAX_BLOCKS, SWEEP_BLOCKS

BS = 4


def busy_manager(make_request, run_step, num_blocks: int = 64) -> KVCacheManager:
    """Two running requests sharing a cached prefix, one finished request's blocks free but cached."""
    manager = KVCacheManager(num_blocks, BS, b"seed")
    done = make_request("done", list(range(100, 100 + 3 * BS)))
    run_step(manager, done)
    manager.free(done)
    for rid in ("a", "b"):
        run_step(manager, make_request(rid, list(range(2 * BS + 1))))
    manager.check_integrity(full=True)
    manager.check_integrity(full=False)
    return manager


def first_free_block(manager):
    return next(b for b in manager.block_pool.blocks[1:] if b.ref_cnt == 0)


def bump_held_ref(m):
    m.req_to_blocks["a"][0].ref_cnt += 1


def held_block_back_in_free_queue(m):
    m.block_pool.eviction_policy.append_n([m.req_to_blocks["a"][-1]])


def free_block_referenced_by_no_table(m):
    first_free_block(m).ref_cnt = 1


def block_leaked_from_the_free_queue(m):
    m.block_pool.get_new_blocks(1)  # ref_cnt 1, in no block table


def map_points_at_the_wrong_block(m):
    cached = m.block_pool.cached_block_hash_to_block
    h = next(iter(cached))
    cached[h] = first_free_block(m) if cached[h] is not first_free_block(m) else m.req_to_blocks["a"][-1]


def cached_block_missing_from_the_map(m):
    cached = m.block_pool.cached_block_hash_to_block
    del cached[m.req_to_blocks["a"][0].block_hash]


def broken_free_queue_link(m):
    block = first_free_block(m)
    block.next_free_block.prev_free_block = block.prev_free_block


def request_holds_the_null_block(m):
    m.req_to_blocks["b"].append(m.block_pool.null_block)


CORRUPTIONS = {
    bump_held_ref: "ref_cnt 3 but 2",  # the shared prefix block: two tables hold it
    held_block_back_in_free_queue: "free queue with a reference|in use but still linked",
    free_block_referenced_by_no_table: "ref_cnt 1 but 0|free queue with a reference|in use but still linked",
    block_leaked_from_the_free_queue: "ref_cnt 1 but 0|a block is lost",
    map_points_at_the_wrong_block: "points at|does not point back",
    cached_block_missing_from_the_map: "does not point back",
    broken_free_queue_link: "broken free-queue link",
    request_holds_the_null_block: "holds the null block",
}


@pytest.mark.parametrize("full", [True, False], ids=["full", "windowed"])
@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=lambda f: f.__name__)
def test_the_check_catches_each_corruption(make_request, run_step, corrupt, full):
    manager = busy_manager(make_request, run_step)
    corrupt(manager)
    with pytest.raises(AssertionError, match=CORRUPTIONS[corrupt]):
        manager.check_integrity(full=full)


def test_the_window_sweeps_the_whole_pool(make_request, run_step):
    manager = busy_manager(make_request, run_step, num_blocks=3 * SWEEP_BLOCKS + 10)
    victim = manager.block_pool.blocks[-5]  # free, and far from where the sweep starts
    assert victim.ref_cnt == 0
    victim.prev_free_block.next_free_block = victim.next_free_block  # unlinked from the queue's forward chain
    start = manager._sweep_start
    caught = None
    for call in range(1, 5):  # ceil(3081 usable / 1024) = 4 windows cover the pool
        try:
            manager.check_integrity(full=False)
        except AssertionError as e:
            caught = call, str(e)
            break
    assert caught is not None and caught[0] > 1 and "broken free-queue link" in caught[1], (start, caught)


def test_a_large_pool_is_checked_by_what_is_in_use_not_by_its_size(make_request, run_step, monkeypatch):
    num_blocks = 8 * FULL_CHECK_MAX_BLOCKS
    manager = KVCacheManager(num_blocks, BS, b"seed")
    for i in range(20):
        run_step(manager, make_request(f"r{i}", list(range(i, i + 5 * BS))))
    manager.free(make_request("r0", []))

    def walk(*args):
        raise AssertionError("walked the whole free queue")

    monkeypatch.setattr(manager.block_pool.eviction_policy, "get_all_free_blocks", walk)
    examined = []
    check_block = pool_integrity.check_block
    monkeypatch.setattr(pool_integrity, "check_block", lambda pool, b: examined.append(b) or check_block(pool, b))
    manager.check_integrity()
    held = sum(len(blocks) for blocks in manager.req_to_blocks.values())
    cached = len(manager.block_pool.cached_block_hash_to_block)
    assert 0 < len(examined) <= SWEEP_BLOCKS + held + cached < num_blocks // 50
    with pytest.raises(AssertionError, match="walked the whole free queue"):
        manager.check_integrity(full=True)
