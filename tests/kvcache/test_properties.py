"""Property tests: after any sequence of operations the pool's invariants hold and the event stream
(and the snapshot) reproduce exactly the set of cached blocks."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvmesh.events.schema import BlockStored
from kvmesh.kvcache.hashing import external_hash
from kvmesh.kvcache.interfaces import TokenRequest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

from .conftest import EventLog

BS = 4
PREFIXES = [[], list(range(2 * BS)), list(range(100, 100 + 3 * BS + 2)), list(range(2 * BS)) + [7] * BS]

new_op = st.tuples(st.just("new"), st.integers(0, len(PREFIXES) - 1), st.integers(1, 3 * BS),
                   st.sampled_from([None, "s1"]), st.integers(1, 4 * BS))
step_op = st.tuples(st.just("step"), st.integers(0, 7), st.integers(1, 2 * BS))
free_op = st.tuples(st.just("free"), st.integers(0, 7))
reset_op = st.tuples(st.just("reset"))
ops = st.lists(st.one_of(new_op, new_op, step_op, step_op, step_op, free_op, reset_op), max_size=40)


def cached_external(manager) -> set[int]:
    return {external_hash(h) for h in manager.block_pool.cached_block_hash_to_block}


def apply(manager, running: list[TokenRequest], op, counter: list[int]) -> None:
    kind = op[0]
    if kind == "new":
        _, prefix, suffix_len, salt, chunk = op
        counter[0] += 1
        tokens = PREFIXES[prefix] + [(counter[0] * 31 + i) % 50 for i in range(suffix_len)]
        req = TokenRequest(f"r{counter[0]}", tokens, cache_salt=salt)
        computed, num_computed = manager.get_computed_blocks(req)
        num_new = min(chunk, req.num_tokens - num_computed)
        if manager.allocate_slots(req, num_new, num_computed, computed) is None:
            manager.free(req)  # never allocated: only drops its hasher
            return
        req.num_computed_tokens = num_computed + num_new
        running.append(req)
    elif kind == "step" and running:
        req = running[op[1] % len(running)]
        if req.num_computed_tokens < req.num_tokens:  # chunked prefill continues
            num_new = min(op[2], req.num_tokens - req.num_computed_tokens)
        else:  # decode: one new token
            req.all_token_ids.append(op[2] % 50)
            num_new = 1
        if manager.allocate_slots(req, num_new) is None:
            manager.free(req)  # preempted
            running.remove(req)
        else:
            req.num_computed_tokens += num_new
    elif kind == "free" and running:
        manager.free(running.pop(op[1] % len(running)))
    elif kind == "reset":
        manager.reset_prefix_cache()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, policy=st.sampled_from(["lru", "slru", "arc"]), num_blocks=st.integers(2, 16))
def test_invariants_and_event_replay_hold_after_any_operations(ops, policy, num_blocks):
    log = EventLog()
    manager = KVCacheManager(num_blocks, BS, b"seed", event_sink=log, eviction_policy=policy)
    running: list[TokenRequest] = []
    counter = [0]
    for op in ops:
        apply(manager, running, op, counter)
        manager.check_integrity(full=True)
        manager.check_integrity(full=False)  # the windowed check of large pools finds no fault either
        assert log.cached == cached_external(manager)
    seen: set[int] = set()
    for event in manager.block_pool.snapshot_events():
        assert isinstance(event, BlockStored)
        assert len(event.token_ids) == BS * len(event.block_hashes)
        parent = event.parent_block_hash
        assert parent is None or parent in seen or parent not in cached_external(manager)
        seen.update(event.block_hashes)
    assert seen == cached_external(manager)
    for req in running:
        manager.free(req)
    manager.check_integrity()
    assert manager.block_pool.get_num_free_blocks() == num_blocks - 1
