"""cache_salt and LoRA names isolate tenants: different keys never share a block."""

import pytest
from kvmesh.events.schema import BlockStored
from kvmesh.kvcache.hashing import cache_salt_secret, external_hash, salt_key
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from msgspec.structs import replace

BS = 4
PROMPT = list(range(13))


def fresh_manager(event_log=None):
    return KVCacheManager(num_blocks=20, block_size=BS, hash_seed=b"seed", event_sink=event_log)


def test_requests_with_different_salts_never_share_a_block(make_request, run_step):
    manager = fresh_manager()
    run_step(manager, make_request("a", PROMPT, cache_salt="tenant-a"))
    for rid, salt in (("b", "tenant-b"), ("c", None)):
        computed, _ = run_step(manager, make_request(rid, PROMPT, cache_salt=salt))
        assert computed == []
    ids = [set(manager.get_block_ids(r)) for r in "abc"]
    assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]


def test_requests_with_the_same_salt_share_blocks(make_request, run_step):
    manager = fresh_manager()
    run_step(manager, make_request("a", PROMPT, cache_salt="tenant-a"))
    computed, _ = run_step(manager, make_request("b", PROMPT, cache_salt="tenant-a"))
    assert [b.block_id for b in computed] == manager.get_block_ids("a")[:3]


def test_different_lora_adapters_never_share_a_block(make_request, run_step):
    manager = fresh_manager()
    run_step(manager, make_request("a", PROMPT, lora_name="l1"))
    assert run_step(manager, make_request("b", PROMPT, lora_name="l2"))[0] == []
    assert len(run_step(manager, make_request("c", PROMPT, lora_name="l1"))[0]) == 3


def test_block_stored_reports_the_salt_key_on_the_first_block_only(make_request, run_step, event_log):
    manager = fresh_manager(event_log)
    run_step(manager, make_request("a", PROMPT, cache_salt="s", lora_name="l1"))
    (stored,) = event_log.of_type(BlockStored)
    assert stored.extra_keys == [("l1", salt_key("s", cache_salt_secret(b"seed"))), ("l1",), ("l1",)]
    assert stored.lora_name == "l1"


def test_the_salt_digest_in_events_cannot_be_confirmed_without_the_cluster_secret(make_request, run_step,
                                                                                  event_log):
    manager = fresh_manager(event_log)
    run_step(manager, make_request("a", PROMPT, cache_salt="acme-corp"))
    (stored,) = event_log.of_type(BlockStored)
    carried = stored.extra_keys[0][0]
    assert carried != salt_key("acme-corp")  # a guessed salt, digested without the secret
    assert carried != salt_key("acme-corp", cache_salt_secret(b"another cluster's seed"))
    assert carried == salt_key("acme-corp", cache_salt_secret(b"seed"))


def test_a_router_given_the_salt_secret_keys_salted_prompts_as_the_replica(make_request, run_step, event_log):
    from kvmesh.router.routing.index import PrefixIndex
    from kvmesh.router.routing.keys import RouterKeyHasher

    manager = fresh_manager(event_log)
    run_step(manager, make_request("a", PROMPT, cache_salt="tenant-a"))
    with_secret = RouterKeyHasher(BS, salt_secret=cache_salt_secret(b"seed"))
    index = PrefixIndex(hasher=with_secret)
    index.add_replica("r")
    index.apply("r", event_log.of_type(BlockStored))
    assert index.match(with_secret.keys(PROMPT, "tenant-a")) == {"r": 3}
    assert index.match(RouterKeyHasher(BS).keys(PROMPT, "tenant-a")) == {}  # no secret: no match
    assert index.match(with_secret.keys(PROMPT, "tenant-b")) == {}


@pytest.mark.parametrize("salt", [None, "tenant-a"])
@pytest.mark.parametrize("without_extra_keys", [False, True])
def test_the_router_keys_an_adapters_prompt_as_the_engine_hashes_it(make_request, run_step, event_log, salt,
                                                                    without_extra_keys):
    """The router's key of an adapter's prompt equals the engine's block hash, through the BlockStored
    events (their lora_name and extra_keys), salted and unsalted; vLLM before 0.33 sends lora_name without
    extra_keys (an unsalted prompt's extra keys are the adapter alone). Another adapter and the base match nothing."""
    from kvmesh.router.routing.kv_router import KVRouter

    if without_extra_keys and salt is not None:
        pytest.skip("a salted block's event always carries extra_keys (the salt is in them)")
    manager = fresh_manager(event_log)
    run_step(manager, make_request("a", PROMPT, cache_salt=salt, lora_name="tiny"))
    (stored,) = event_log.of_type(BlockStored)
    assert stored.lora_name == "tiny" and stored.extra_keys[-1] == ("tiny",)
    if without_extra_keys:
        stored = replace(stored, extra_keys=None)
    router = KVRouter(block_size=BS, salt_secret=cache_salt_secret(b"seed"))
    router.add_replica("r")
    router.apply_events("r", [stored])
    engine_hashes = [external_hash(h) for h in manager.block_pool.cached_block_hash_to_block]
    assert sorted(router.index.cached_hashes("r")) == sorted(engine_hashes)
    assert router.route(PROMPT, salt, "tiny").matched_blocks == 3  # every full block: the keys agree
    for other_salt, lora in ((salt, "sql"), (salt, None), ("tenant-b", "tiny")):
        assert router.index.match(router.hasher.keys(PROMPT, other_salt, lora)) == {}
