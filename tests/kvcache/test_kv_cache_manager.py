"""KV cache manager and block pool behaviour beyond exact ordering: validation, stats, reset."""

import pytest
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored
from kvmesh.kvcache.block_pool import BlockPool
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.kvcache.pool_integrity import check_pool_integrity

BS = 4


@pytest.fixture
def manager(event_log):
    return KVCacheManager(num_blocks=9, block_size=BS, hash_seed=b"seed", event_sink=event_log)


@pytest.mark.parametrize("num_blocks, block_size, match", [(1, 4, "num_blocks"), (8, 0, "block_size"),
                                                           (8, -2, "block_size")])
def test_bad_pool_shapes_raise_value_error(num_blocks, block_size, match):
    with pytest.raises(ValueError, match=match):
        KVCacheManager(num_blocks, block_size, hash_seed=b"s")


def test_unknown_eviction_policy_raises_value_error():
    with pytest.raises(ValueError, match="unknown eviction policy"):
        BlockPool(8, 4, eviction_policy="mru")


def test_negative_token_ids_raise_value_error(manager, make_request):
    with pytest.raises(ValueError, match="token id -3"):
        manager.get_computed_blocks(make_request("r", [1, 2, 3, -3, 5]))


def test_freeing_a_request_twice_raises_value_error(manager, make_request, run_step):
    req = make_request("r", list(range(6)))
    run_step(manager, req)
    manager.free(req)
    with pytest.raises(ValueError, match="already freed"):
        manager.free(req)
    manager.free(make_request("never-allocated", [1]))  # nothing to release: not an error


def test_a_preempted_request_can_be_allocated_and_freed_again(manager, make_request, run_step):
    req = make_request("r", list(range(6)))
    run_step(manager, req)
    manager.free(req)
    req.num_computed_tokens = 0
    computed, _ = run_step(manager, req)
    assert len(computed) == 1
    manager.free(req)
    manager.check_integrity()


def test_null_block_is_never_handed_out():
    pool = BlockPool(num_blocks=5, block_size=4)
    blocks = pool.get_new_blocks(4)
    assert sorted(b.block_id for b in blocks) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)
    pool.free_blocks(blocks)
    check_pool_integrity(pool)


def test_usage_is_the_fraction_of_usable_blocks_in_use(manager, make_request, run_step):
    assert manager.usage == 0.0
    run_step(manager, make_request("r", list(range(2 * BS))))
    assert manager.usage == pytest.approx(2 / 8)


def test_prefix_cache_stats_count_tokens(manager, make_request, run_step):
    run_step(manager, make_request("a", list(range(10))))
    run_step(manager, make_request("b", list(range(10))))
    stats = manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 20, 8)
    assert stats.hit_rate == pytest.approx(0.4)
    stats.reset()
    assert stats.hit_rate == 0.0


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use(manager, make_request, run_step, event_log):
    req = make_request("r", list(range(10)))
    run_step(manager, req)
    assert manager.reset_prefix_cache() is False
    manager.free(req)
    assert manager.reset_prefix_cache() is True
    assert isinstance(event_log.events[-1], AllBlocksCleared)
    assert manager.block_pool.cached_block_hash_to_block == {}
    assert manager.get_computed_blocks(make_request("s", list(range(10)))) == ([], 0)
    manager.check_integrity()


def test_reset_unreferenced_clears_everything_when_no_request_holds_a_block(manager, make_request, run_step,
                                                                           event_log):
    req = make_request("r", list(range(10)))
    run_step(manager, req)
    manager.free(req)
    assert manager.reset_unreferenced() == 2
    assert isinstance(event_log.events[-1], AllBlocksCleared)
    assert manager.block_pool.cached_block_hash_to_block == {} and event_log.cached == set()
    manager.check_integrity()


def test_reset_unreferenced_keeps_the_blocks_a_running_request_holds(manager, make_request, run_step, event_log):
    shared = list(range(8))  # two full blocks both prompts start with
    running = make_request("running", [*shared, 100, 101, 102, 103, 104])
    done = make_request("done", [*shared, 200, 201, 202, 203, 204])
    run_step(manager, running)
    run_step(manager, done)
    manager.free(done)
    held = {b.block_hash for b in manager.req_to_blocks["running"] if b.block_hash is not None}
    assert manager.reset_unreferenced() == 1  # only "done"'s own third block: the shared two are held
    assert isinstance(event_log.events[-1], BlockRemoved)
    assert set(manager.block_pool.cached_block_hash_to_block) == held
    assert len(event_log.cached) == len(held) == 3  # the events say exactly what stays cached
    assert manager.get_computed_blocks(make_request("again", done.all_token_ids))[1] == 8
    manager.check_integrity()
    manager.free(running)
    assert manager.reset_unreferenced() == 3 and isinstance(event_log.events[-1], AllBlocksCleared)
    manager.check_integrity()


def test_reset_unreferenced_evicted_blocks_are_handed_out_again(manager, make_request, run_step):
    held = make_request("held", list(range(12)))
    run_step(manager, held)
    for i in range(2):
        req = make_request(f"gone{i}", list(range(100 * (i + 1), 100 * (i + 1) + 8)))
        run_step(manager, req)
        manager.free(req)
    manager.reset_unreferenced()
    big = make_request("big", list(range(1000, 1000 + 5 * BS)))  # every free block, none still cached
    assert run_step(manager, big)[1] is not None
    assert manager.block_pool.get_num_free_blocks() == 0
    manager.check_integrity()


def test_disabled_caching_neither_hits_nor_emits(make_request, run_step, event_log):
    manager = KVCacheManager(9, BS, b"seed", enable_caching=False, event_sink=event_log)
    for rid in ("a", "b"):
        req = make_request(rid, list(range(10)))
        computed, new = run_step(manager, req)
        assert computed == [] and len(new) == 3
        manager.free(req)
    assert event_log.events == []
    manager.check_integrity()


def test_events_carry_medium_and_block_size(make_request, run_step, event_log):
    manager = KVCacheManager(3, BS, b"seed", event_sink=event_log, medium="GPU")
    first = make_request("a", list(range(8)))
    run_step(manager, first)
    manager.free(first)
    run_step(manager, make_request("b", [9] * 8))
    stored = event_log.of_type(BlockStored)[0]
    assert stored.medium == "GPU" and stored.block_size == BS and stored.extra_keys is None
    removed = event_log.of_type(BlockRemoved)
    assert len(removed) == 1 and len(removed[0].block_hashes) == 2 and removed[0].medium == "GPU"


def test_debug_mode_checks_invariants_after_each_operation(make_request, run_step):
    manager = KVCacheManager(9, BS, b"seed", debug=True)
    req = make_request("r", list(range(10)))
    run_step(manager, req)
    manager.req_to_blocks["r"][0].ref_cnt += 1  # corrupt the pool behind the manager's back
    with pytest.raises(AssertionError, match="ref_cnt"):
        manager.allocate_slots(req, 1)


def test_negative_num_new_tokens_raises_value_error(manager, make_request):
    with pytest.raises(ValueError, match="num_new_tokens"):
        manager.allocate_slots(make_request("r", [1, 2]), -1)
