"""Eviction policies: registry, SLRU segments, and a hot prefix surviving a burst of one-off prompts."""

import pytest
from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.eviction import EVICTION_POLICIES, make_eviction_policy
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

BS = 4
HOT = list(range(1000, 1000 + 4 * BS))  # a 4-block shared system prompt


def test_registry_names_lru_slru_and_arc():
    assert {"lru", "slru", "arc"} <= set(EVICTION_POLICIES)
    with pytest.raises(ValueError, match="choose one of"):
        make_eviction_policy("fifo", [], 4)


@pytest.mark.parametrize("kwargs", [{"protected_fraction": 0.0}, {"protected_fraction": 1.0},
                                    {"promote_after_hits": 0}])
def test_slru_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        make_eviction_policy("slru", [], 8, **kwargs)


def test_slru_evicts_never_hit_blocks_before_hit_ones():
    blocks = [KVCacheBlock(i) for i in range(1, 7)]
    policy = make_eviction_policy("slru", [], 7)
    for b in blocks:
        b.block_hash = bytes([b.block_id]) * 16
    blocks[0].hit_count = blocks[1].hit_count = 1
    policy.append_n(blocks)
    assert [b.block_id for b in policy.get_all_free_blocks()] == [3, 4, 5, 6, 1, 2]
    assert [b.block_id for b in policy.popleft_n(5)] == [3, 4, 5, 6, 1]
    assert policy.num_free_blocks == 1


def test_slru_demotes_the_oldest_protected_blocks_beyond_its_capacity():
    policy = make_eviction_policy("slru", [], 11, protected_fraction=0.2)  # 2 protected blocks
    blocks = [KVCacheBlock(i) for i in range(1, 5)]
    for b in blocks:
        b.block_hash, b.hit_count = bytes([b.block_id]) * 16, 3
    policy.append_n(blocks)
    assert [b.block_id for b in policy.protected.get_all_free_blocks()] == [3, 4]
    assert [b.block_id for b in policy.probation.get_all_free_blocks()] == [1, 2]
    assert blocks[0].hit_count == 0 and not blocks[0].protected
    policy.remove(blocks[2])
    assert [b.block_id for b in policy.get_all_free_blocks()] == [1, 2, 4]


def replay_hot_prefix_with_burst(policy: str, make_request, run_step) -> int:
    """Hot prompt twice, a burst of one-off prompts bigger than the pool, hot prompt again."""
    manager = KVCacheManager(num_blocks=21, block_size=BS, hash_seed=b"seed", eviction_policy=policy)
    for i in range(2):
        req = make_request(f"hot{i}", HOT + [i])
        run_step(manager, req)
        manager.free(req)
    for i in range(10):  # 10 x 4 blocks through a 20-block pool
        req = make_request(f"burst{i}", [10_000 * (i + 1) + t for t in range(4 * BS)])
        run_step(manager, req)
        manager.free(req)
        manager.check_integrity()
    computed, _ = run_step(manager, make_request("hot-again", HOT + [7]))
    return len(computed)


def test_hot_prefix_is_lost_to_a_burst_of_one_off_prompts_with_lru(make_request, run_step):
    assert replay_hot_prefix_with_burst("lru", make_request, run_step) == 0


@pytest.mark.parametrize("policy", ["slru", "arc"])
def test_hot_prefix_survives_a_burst_of_one_off_prompts_with_frequency_aware_policies(
        policy, make_request, run_step):
    assert replay_hot_prefix_with_burst(policy, make_request, run_step) == 4


def test_arc_grows_probation_when_evicted_once_used_blocks_come_back(make_request, run_step):
    """Late reuse (a conversation's next turn after other traffic) moves ARC's target toward recency."""
    manager = KVCacheManager(num_blocks=13, block_size=BS, hash_seed=b"seed", eviction_policy="arc")
    policy = manager.block_pool.eviction_policy
    conversations = [[100 * (c + 1) + t for t in range(3 * BS)] for c in range(4)]
    for c, prompt in enumerate(conversations):  # 4 x 4 blocks through 12: c0's history is evicted
        req = make_request(f"c{c}", prompt + [0])
        run_step(manager, req)
        manager.free(req)
    assert len(policy.ghost_probation) == 3 and policy.target_probation == 0
    again = make_request("c0-turn2", conversations[0] + [1])
    computed, _ = run_step(manager, again)
    assert computed == []  # recomputed: the 3 ghost hits each grow the target by 1
    assert policy.target_probation == 3
    full_blocks = manager.req_to_blocks["c0-turn2"][:3]
    assert not {b.block_hash for b in full_blocks} & set(policy.ghost_probation)
    manager.free(again)  # reused content: it joins the protected segment, tail first
    assert policy.protected.get_all_free_blocks() == full_blocks[::-1]
    manager.check_integrity()


def test_arc_shrinks_probation_when_evicted_reused_blocks_come_back():
    policy = make_eviction_policy("arc", [], 9)
    blocks = [KVCacheBlock(i) for i in range(1, 5)]
    for b in blocks:
        b.block_hash, b.hit_count = bytes([b.block_id]) * 16, 1
    policy.target_probation = 4.0
    policy.append_n(blocks)
    assert policy.protected.num_free_blocks == 4
    evicted = policy.popleft_n(2)  # T1 is empty: T2's oldest go, into the B2 ghost
    assert [b.block_id for b in evicted] == [1, 2] and len(policy.ghost_protected) == 2
    evicted[0].hit_count = 0
    policy.on_cached([evicted[0]])
    assert policy.target_probation == 3.0 and evicted[0].hit_count == 1


@pytest.mark.parametrize("policy", ["lru", "slru", "arc"])
def test_every_policy_keeps_the_pool_consistent(policy, make_request, run_step):
    manager = KVCacheManager(num_blocks=9, block_size=BS, hash_seed=b"s", eviction_policy=policy)
    for i in range(30):
        req = make_request(f"r{i}", [i % 3] * (BS * (1 + i % 4)) + [i])
        run_step(manager, req)
        manager.free(req)
        manager.check_integrity()
    assert manager.reset_prefix_cache()
    manager.check_integrity()
