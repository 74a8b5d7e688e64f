"""snapshot_events(): the cached set as parent-first BlockStored chains."""

from kvmesh.events.schema import BlockStored
from kvmesh.kvcache.hashing import external_hash
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

BS = 4


def cached_external(manager):
    return {external_hash(h) for h in manager.block_pool.cached_block_hash_to_block}


def test_snapshot_of_a_branching_tree_is_parent_first_chains(make_request, run_step):
    manager = KVCacheManager(num_blocks=12, block_size=BS, hash_seed=b"seed")
    run_step(manager, make_request("a", list(range(12)) + [1]))  # A B C
    run_step(manager, make_request("b", list(range(8)) + [50, 51, 52, 53, 1]))  # A B F
    events = manager.block_pool.snapshot_events()
    assert all(isinstance(e, BlockStored) for e in events)
    assert [len(e.block_hashes) for e in events] == [3, 1]
    assert events[0].parent_block_hash is None and events[0].token_ids == list(range(12))
    assert events[1].parent_block_hash == events[0].block_hashes[1]
    assert events[1].token_ids == [50, 51, 52, 53]


def test_blocks_whose_parent_was_evicted_start_a_chain_with_the_recorded_parent(make_request, run_step):
    manager = KVCacheManager(num_blocks=6, block_size=BS, hash_seed=b"seed")
    req = make_request("a", list(range(12)) + [1])  # blocks 1 2 3 cached, 4 partial
    run_step(manager, req)
    root_hash = manager.block_pool.blocks[1].block_hash
    manager.free(req)  # free queue: 5, 4, 3, 2, 1
    manager.block_pool.touch([manager.block_pool.blocks[2], manager.block_pool.blocks[3]])
    manager.block_pool.get_new_blocks(3)  # takes 5, 4, then evicts block 1 (the root)
    events = manager.block_pool.snapshot_events()
    assert len(events) == 1 and events[0].parent_block_hash == external_hash(root_hash)
    assert set(events[0].block_hashes) == cached_external(manager)


def test_snapshot_replay_reproduces_the_cached_set(make_request, run_step):
    manager = KVCacheManager(num_blocks=30, block_size=BS, hash_seed=b"seed", eviction_policy="slru")
    for i in range(25):
        req = make_request(f"r{i}", [i % 4] * (BS * (i % 5)) + [i] * BS + [1])
        run_step(manager, req)
        manager.free(req)
    seen: set[int] = set()
    for event in manager.block_pool.snapshot_events():
        parent = event.parent_block_hash
        assert parent is None or parent in seen or parent not in cached_external(manager)
        seen.update(event.block_hashes)
    assert seen == cached_external(manager)


def test_empty_pool_has_an_empty_snapshot():
    assert KVCacheManager(4, BS, b"s").block_pool.snapshot_events() == []


def test_snapshot_groups_chains_by_adapter_and_replays_them(make_request, run_step):
    manager = KVCacheManager(num_blocks=20, block_size=BS, hash_seed=b"seed")
    prompt = list(range(8)) + [1]
    run_step(manager, make_request("base", prompt))
    run_step(manager, make_request("tiny", prompt, lora_name="tiny"))
    run_step(manager, make_request("other", prompt, lora_name="other"))
    events = manager.block_pool.snapshot_events()
    by_adapter = {e.lora_name: e for e in events}
    assert sorted(by_adapter, key=str) == sorted([None, "tiny", "other"], key=str) and len(events) == 3
    assert by_adapter["tiny"].extra_keys == [("tiny",), ("tiny",)] and by_adapter[None].extra_keys is None
    assert set(by_adapter["tiny"].block_hashes).isdisjoint(by_adapter[None].block_hashes)
    # replay: a router's index fed only the snapshot keys an adapter's prompt as the engine does
    from kvmesh.router.routing.index import PrefixIndex
    from kvmesh.router.routing.keys import RouterKeyHasher

    hasher = RouterKeyHasher(BS)
    index = PrefixIndex(hasher=hasher)
    index.add_replica("r0")
    index.apply("r0", [e for e in events if e.lora_name == "tiny"])
    assert index.match(hasher.keys(prompt[:8], None, "tiny")) == {"r0": 2}
    assert index.match(hasher.keys(prompt[:8], None, None)) == {}
