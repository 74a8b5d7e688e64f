"""The host tier: copies down after caching, findable only once landed, loaded back past the device prefix."""

from __future__ import annotations

from kvmesh.events.schema import BlockRemoved, BlockStored
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

BS = 4


def manager_with_tier(event_log, device_blocks=5, host_blocks=17, **kw):
    return KVCacheManager(device_blocks, BS, b"seed", event_sink=event_log, num_host_blocks=host_blocks,
                          debug=True, **kw)


def finish_step(manager, landed=True):
    """What the engine does after the runner ran a step: report its stores landed."""
    copies = manager.take_offload_copies()
    if copies is not None and landed:
        manager.complete_offload_stores([copies.job_id])
    return copies


def test_cached_blocks_are_copied_down_after_the_step(make_request, run_step, event_log):
    manager = manager_with_tier(event_log)
    run_step(manager, make_request("a", range(9)))  # 2 full blocks
    copies = manager.take_offload_copies()
    assert copies.loads == [] and [d for d, _ in copies.stores] == manager.get_block_ids("a")[:2]
    assert [e.medium for e in event_log.of_type(BlockStored)] == ["GPU"]  # the host copy is in flight
    manager.complete_offload_stores([copies.job_id])
    stored = event_log.of_type(BlockStored)
    assert [e.medium for e in stored] == ["GPU", "CPU"]
    assert stored[0].block_hashes == stored[1].block_hashes and stored[0].token_ids == stored[1].token_ids
    manager.check_integrity()


def test_block_in_flight_is_neither_findable_nor_reusable(make_request, run_step, event_log):
    manager = manager_with_tier(event_log, device_blocks=4)
    a = make_request("a", range(9))  # 3 blocks: 2 full and cached, 1 partial
    run_step(manager, a)
    copies = finish_step(manager, landed=False)
    manager.free(a)
    assert manager.block_pool.get_num_free_blocks() == 1  # the 2 copied blocks are still held
    in_flight = list(manager.offload.host.in_flight)
    assert len(in_flight) == 2 and manager.offload.lookup(in_flight, 0, 2) == []  # not findable yet
    assert run_step(manager, make_request("b", [50] * 8))[1] is None  # no room: nothing was recycled
    manager.complete_offload_stores([copies.job_id])
    assert manager.block_pool.get_num_free_blocks() == 3
    manager.check_integrity()


def test_prefix_evicted_from_device_is_loaded_back_from_host(make_request, run_step, event_log):
    manager = manager_with_tier(event_log)
    a = make_request("a", range(13))  # 3 full blocks + 1 token
    run_step(manager, a)
    finish_step(manager)
    manager.free(a)
    other = make_request("x", [99] * 16)  # recycles every device block
    run_step(manager, other)
    finish_step(manager)
    manager.free(other)
    removed = [e for e in event_log.of_type(BlockRemoved) if e.medium == "GPU"]
    assert sum(len(e.block_hashes) for e in removed) == 3
    again = make_request("a2", range(13))
    computed, num_cached = manager.get_computed_blocks(again)
    assert computed == [] and num_cached == 12  # all three blocks, from the host tier
    new_blocks = manager.allocate_slots(again, 1, num_cached, computed)
    copies = manager.take_offload_copies()
    assert [d for _, d in copies.loads] == [b.block_id for b in new_blocks[:3]]
    assert copies.stores == []  # the host already holds them
    assert manager.offload.stats.hit_blocks == 3
    manager.check_integrity()


def test_host_tier_evicts_with_its_own_policy_and_says_so(make_request, run_step, event_log):
    manager = manager_with_tier(event_log, device_blocks=5, host_blocks=3)  # 2 usable host blocks
    for i in range(3):
        req = make_request(f"r{i}", [100 * i + t for t in range(5)])  # 1 full block each
        run_step(manager, req)
        finish_step(manager)
        manager.free(req)
    host_removed = [e for e in event_log.of_type(BlockRemoved) if e.medium == "CPU"]
    host_stored = [e for e in event_log.of_type(BlockStored) if e.medium == "CPU"]
    assert len(host_stored) == 3 and len(host_removed) == 1
    assert host_removed[0].block_hashes == host_stored[0].block_hashes  # least recently used went first


def test_snapshot_carries_both_tiers(make_request, run_step, event_log):
    manager = manager_with_tier(event_log)
    run_step(manager, make_request("a", range(9)))
    finish_step(manager)
    media = sorted(e.medium for e in manager.snapshot_events())
    assert media == ["CPU", "GPU"]


def test_failed_step_releases_its_copies(make_request, run_step, event_log):
    manager = manager_with_tier(event_log)
    a = make_request("a", range(9))
    run_step(manager, a)
    copies = finish_step(manager, landed=False)
    manager.cancel_offload_copies([copies.job_id])
    manager.free(a)
    assert manager.block_pool.get_num_free_blocks() == 4 and not manager.offload.host.in_flight
    assert [e.medium for e in event_log.of_type(BlockStored)] == ["GPU"]
    manager.check_integrity()


def test_without_a_tier_nothing_is_copied(make_request, run_step, event_log):
    manager = KVCacheManager(5, BS, b"seed", event_sink=event_log)
    run_step(manager, make_request("a", range(9)))
    assert manager.take_offload_copies() is None
    assert {e.medium for e in event_log.events} == {"GPU"}


def test_host_tier_evicts_a_chains_tail_before_its_head(make_request, run_step, event_log):
    manager = manager_with_tier(event_log, device_blocks=5, host_blocks=4)  # 3 usable host blocks
    a = make_request("a", range(13))  # 3 full blocks, copied down as one chain
    run_step(manager, a)
    finish_step(manager)
    manager.free(a)
    b = make_request("b", [100 + t for t in range(5)])  # 1 more block: the host evicts one of a's
    run_step(manager, b)
    finish_step(manager)
    host_stored = [e for e in event_log.of_type(BlockStored) if e.medium == "CPU"]
    (removed,) = [e for e in event_log.of_type(BlockRemoved) if e.medium == "CPU"]
    assert removed.block_hashes == [host_stored[0].block_hashes[-1]]  # a's last block; its prefix stays usable
