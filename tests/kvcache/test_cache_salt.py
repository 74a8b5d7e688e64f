"""cache_salt and LoRA names isolate tenants: different keys never share a block."""

from kvmesh.events.schema import BlockStored
from kvmesh.kvcache.hashing import cache_salt_secret, salt_key
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

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
