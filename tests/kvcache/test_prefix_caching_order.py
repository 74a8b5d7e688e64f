"""Exact block ids, hits and eviction order for scripted requests (in the style of vLLM's tests).

Pool: 11 blocks (block 0 is the null block), block_size 4, LRU.
"""

import pytest
from kvmesh.events.schema import BlockRemoved, BlockStored
from kvmesh.kvcache.hashing import external_hash
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

BS = 4


def free_ids(manager):
    return [b.block_id for b in manager.block_pool.eviction_policy.get_all_free_blocks()]


def removed_hashes(log):
    return [h for e in log.of_type(BlockRemoved) for h in e.block_hashes]


@pytest.fixture
def manager(event_log):
    return KVCacheManager(num_blocks=11, block_size=BS, hash_seed=b"seed", event_sink=event_log)


def test_scripted_requests_hit_allocate_and_evict_in_exact_order(manager, make_request, run_step, event_log):
    common = list(range(12))  # 3 full blocks
    req0 = make_request("req0", common + [100, 101])  # 3 full blocks + 2 tokens
    computed, new = run_step(manager, req0)
    assert computed == [] and [b.block_id for b in new] == [1, 2, 3, 4]
    stored = event_log.of_type(BlockStored)
    assert len(stored) == 1 and stored[0].parent_block_hash is None and stored[0].token_ids == common
    h0 = [b.block_hash for b in new[:3]]

    req1 = make_request("req1", common + [200, 201, 202, 203, 204])  # shares 3 blocks
    computed, new = run_step(manager, req1)
    assert [b.block_id for b in computed] == [1, 2, 3]
    assert [b.block_id for b in new] == [5, 6]
    assert manager.get_block_ids("req1") == [1, 2, 3, 5, 6]
    assert [b.ref_cnt for b in computed] == [2, 2, 2]
    # Only block 5 (tokens 12..15) became full; its event hangs below block 3.
    last = event_log.of_type(BlockStored)[-1]
    assert last.parent_block_hash == external_hash(h0[2]) and last.token_ids == [200, 201, 202, 203]

    manager.free(req0)  # only block 4 (req0's private partial block) drops to zero
    assert free_ids(manager) == [7, 8, 9, 10, 4]
    manager.free(req1)  # tail first: 6, 5, then the shared roots 3, 2, 1
    assert free_ids(manager) == [7, 8, 9, 10, 4, 6, 5, 3, 2, 1]
    manager.check_integrity()

    # A miss takes never-used blocks and the uncached partial block 4: nothing is evicted.
    req2 = make_request("req2", [300 + i for i in range(17)])
    computed, new = run_step(manager, req2)
    assert computed == [] and [b.block_id for b in new] == [7, 8, 9, 10, 4]
    assert removed_hashes(event_log) == []

    # The next miss recycles req1's tail: block 6 (partial, uncached), then block 5 (cached: evicted).
    block5_hash = manager.block_pool.blocks[5].block_hash
    req3 = make_request("req3", [400 + i for i in range(6)])
    computed, new = run_step(manager, req3)
    assert [b.block_id for b in new] == [6, 5]
    assert removed_hashes(event_log) == [external_hash(block5_hash)]
    assert block5_hash not in manager.block_pool.cached_block_hash_to_block
    assert free_ids(manager) == [3, 2, 1]

    # The shared prefix survived in the free queue; a hit revives blocks 1 and 2 out of it, and
    # req4's one new block is the last free one, block 3, whose cached content is evicted now.
    block3_hash = manager.block_pool.blocks[3].block_hash
    req4 = make_request("req4", common[:8] + [500, 501, 502])
    computed, new = run_step(manager, req4)
    assert [b.block_id for b in computed] == [1, 2] and req4.num_computed_tokens == 11
    assert [b.block_id for b in new] == [3]
    assert removed_hashes(event_log) == [external_hash(block5_hash), external_hash(block3_hash)]
    assert free_ids(manager) == []
    assert manager.prefix_cache_stats.hits == 12 + 8
    manager.check_integrity()


def test_revived_block_is_pulled_from_the_middle_of_the_free_queue(manager, make_request, run_step):
    a = make_request("a", list(range(8)) + [99])  # blocks 1, 2 full, 3 partial
    run_step(manager, a)
    manager.free(a)
    assert free_ids(manager) == [4, 5, 6, 7, 8, 9, 10, 3, 2, 1]
    b = make_request("b", list(range(4)) + [50, 51])  # hits block 1 only
    computed, new = run_step(manager, b)
    assert [blk.block_id for blk in computed] == [1]
    assert [blk.block_id for blk in new] == [4]
    assert free_ids(manager) == [5, 6, 7, 8, 9, 10, 3, 2]
    manager.check_integrity()


def test_free_returns_tail_blocks_first(manager, make_request, run_step):
    req = make_request("r", list(range(3 * BS)))
    run_step(manager, req)
    assert manager.get_block_ids("r") == [1, 2, 3]
    manager.free(req)
    assert free_ids(manager)[-3:] == [3, 2, 1]


def test_hit_is_capped_so_the_last_token_is_recomputed(manager, make_request, run_step):
    run_step(manager, make_request("a", list(range(2 * BS))))
    computed, num_tokens = manager.get_computed_blocks(make_request("b", list(range(2 * BS))))
    assert [b.block_id for b in computed] == [1] and num_tokens == BS
    computed, num_tokens = manager.get_computed_blocks(make_request("c", list(range(2 * BS + 1))))
    assert [b.block_id for b in computed] == [1, 2] and num_tokens == 2 * BS


def test_decode_filled_block_is_cached_and_announced(manager, make_request, run_step, event_log):
    req = make_request("r", list(range(6)))
    run_step(manager, req)
    assert manager.num_cached_block["r"] == 1
    for token in (60, 61):  # decode: one token per step, the second fills block 2
        req.all_token_ids.append(token)
        new = manager.allocate_slots(req, 1)
        assert new == []
        req.num_computed_tokens += 1
    assert manager.num_cached_block["r"] == 2
    last = event_log.of_type(BlockStored)[-1]
    assert last.token_ids == [4, 5, 60, 61] and len(last.block_hashes) == 1
    req.all_token_ids.append(62)
    assert [b.block_id for b in manager.allocate_slots(req, 1)] == [3]
    manager.check_integrity()


def test_allocate_returns_none_when_the_pool_cannot_fit_the_step(manager, make_request, run_step):
    big = make_request("big", list(range(9 * BS)))
    run_step(manager, big)
    assert manager.block_pool.get_num_free_blocks() == 1
    other = make_request("other", [7] * (2 * BS))
    assert manager.allocate_slots(other, 2 * BS) is None
    assert manager.get_block_ids("other") == [] and manager.block_pool.get_num_free_blocks() == 1
    manager.check_integrity()


def test_duplicate_content_computed_in_one_step_is_cached_once(manager, make_request, event_log):
    a, b = make_request("a", list(range(9))), make_request("b", list(range(9)))
    looked_up = [manager.get_computed_blocks(r) for r in (a, b)]  # both miss: neither is cached yet
    assert all(n == 0 for _, n in looked_up)
    assert manager.allocate_slots(a, 9) is not None and manager.allocate_slots(b, 9) is not None
    assert len(event_log.of_type(BlockStored)) == 1
    assert [blk.block_hash is None for blk in manager.req_to_blocks["b"]] == [True, True, True]
    manager.check_integrity()
