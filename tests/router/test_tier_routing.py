"""Routing with host-memory tiers: the index keeps each block's tier, and a replica is priced by its
estimated time to first token from the rates it measured itself (no hand-set weights)."""

from __future__ import annotations

import random

from kvmesh.events.schema import AllBlocksCleared
from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import removed, stored

BS = 16
PROMPT = list(range(1000, 1000 + 32 * BS + 5))  # 32 full blocks and a tail


def report(prefill_tokens_per_s=10_000.0, h2d_bytes_per_s=None, kv_block_bytes=None) -> LoadReport:
    return LoadReport(num_requests_running=0, num_requests_waiting=0, kv_cache_usage=0.0,
                      num_waiting_prefill_tokens=0, prefill_tokens_per_s=prefill_tokens_per_s,
                      h2d_bytes_per_s=h2d_bytes_per_s, kv_block_bytes=kv_block_bytes,
                      num_host_kv_blocks=0 if h2d_bytes_per_s is None else 1000)


def make_router(*replicas: str, **rates) -> KVRouter:
    router = KVRouter(block_size=BS, predict_ttl_s=0.0)
    for rid in replicas:
        router.add_replica(rid)
        router.loads.loads[rid].update_report(report(**rates))
    return router


def test_device_and_host_blocks_are_indexed_apart():
    router = make_router("a")
    router.apply_events("a", [stored(PROMPT, BS, num_blocks=8), stored(PROMPT, BS, num_blocks=20, medium="CPU")])
    keys = router.hasher.keys(PROMPT)
    assert router.index.match_tiers(keys) == TierMatches({"a": 8}, {"a": 20})
    router.apply_events("a", [removed(PROMPT, BS, [10], medium="CPU")])
    assert router.index.match_tiers(keys) == TierMatches({"a": 8}, {"a": 10})
    router.apply_events("a", [AllBlocksCleared()])
    assert router.index.match_tiers(keys) == TierMatches({}, {})


def test_router_prefers_a_device_hit_to_an_equal_host_hit():
    for device, host in (("a", "b"), ("b", "a")):  # both orders: not a tie broken by luck
        router = make_router("a", "b", h2d_bytes_per_s=20e9, kv_block_bytes=1 << 20)
        router.apply_events(device, [stored(PROMPT, BS)])
        router.apply_events(host, [stored(PROMPT, BS, medium="CPU")])
        decision = router.route(PROMPT)
        assert decision.replica_id == device and decision.host_hit_tokens == 0


def test_router_prefers_a_host_hit_to_recomputing_when_the_load_back_is_cheaper():
    # 32 blocks of 1 MiB: at 20 GB/s 1.7 ms to load, at 10k tokens/s 51 ms to recompute
    router = make_router("a", "b", h2d_bytes_per_s=20e9, kv_block_bytes=1 << 20)
    router.apply_events("a", [stored(PROMPT, BS, medium="CPU")])
    decision = router.route(PROMPT)
    assert decision.replica_id == "a"
    assert decision.host_hit_tokens == decision.predicted_hit_tokens == 32 * BS
    # at 100 MB/s the same load-back takes 0.34 s: recomputing elsewhere is faster
    slow = make_router("a", "b", h2d_bytes_per_s=100e6, kv_block_bytes=1 << 20)
    slow.apply_events("a", [stored(PROMPT, BS, medium="CPU")])
    assert slow.route(PROMPT).replica_id == "b"


def test_host_blocks_past_the_device_prefix_add_to_the_hit():
    router = make_router("a", "b", h2d_bytes_per_s=20e9, kv_block_bytes=1 << 20)
    router.apply_events("a", [stored(PROMPT, BS, num_blocks=10), stored(PROMPT, BS, medium="CPU")])
    router.apply_events("b", [stored(PROMPT, BS, num_blocks=20)])
    decision = router.route(PROMPT)
    assert decision.replica_id == "a"
    assert decision.predicted_hit_tokens == 32 * BS and decision.host_hit_tokens == 22 * BS
    assert decision.receipt.headers()["x-kvmesh-predicted-host-hit-tokens"] == str(22 * BS)
    assert decision.receipt.log_fields()["predicted_host_hit_tokens"] == 22 * BS


def _decisions(router: KVRouter, rng: random.Random) -> list:
    prefixes = [[rng.randrange(3, 30_000) for _ in range(8 * BS)] for _ in range(6)]
    out = []
    for i in range(200):
        prompt = rng.choice(prefixes) + [rng.randrange(3, 30_000) for _ in range(rng.randrange(1, 6 * BS))]
        decision = router.route(prompt, now=float(i))
        out.append(decision.replica_id)
        router.loads.on_dispatch(decision.replica, decision.uncached_tokens, now=float(i))
        if i % 3 == 0:  # the replica's events confirm the blocks it computed
            router.apply_events(decision.replica_id, [stored(prompt, BS)])
        if i % 7 == 0:
            router.loads.on_finish(decision.replica, decision.uncached_tokens, had_output=False)
    return out


def test_a_replica_that_reports_no_rate_is_priced_at_the_rate_the_others_measured():
    measured = make_router("a", "b", "c")  # rates reported, no tier
    one_silent = make_router("a", "b", "c")
    one_silent.loads.loads["c"].prefill_tokens_per_s = None  # not measured yet: the fleet's (slowest) rate
    assert _decisions(measured, random.Random(7)) == _decisions(one_silent, random.Random(7))
    assert measured.index.host_tiers == 0


def test_a_host_tier_is_a_field_of_its_replicas_entry_with_a_slot_of_its_own():
    router = make_router("a", "b")
    index = router.index
    router.apply_events("a", [stored(PROMPT, BS, num_blocks=4), stored(PROMPT, BS, num_blocks=12, medium="CPU")])
    router.apply_events("b", [stored(PROMPT, BS, num_blocks=6)])
    entry = index._replicas["a"]
    assert entry.host is not None and entry.host.slot not in (entry.slot, index._replicas["b"].slot)
    assert index._replicas["b"].host is None and index.host_tiers == 1
    keys = router.hasher.keys(PROMPT)
    assert index.match_tiers(keys) == TierMatches({"a": 4, "b": 6}, {"a": 12})
    assert index.match(keys) == {"a": 4, "b": 6}  # the GPU pools alone
    router.apply_events("a", [AllBlocksCleared()])  # both tiers go
    assert index.match_tiers(keys) == TierMatches({"b": 6}, {})
    router.apply_events("a", [stored(PROMPT, BS, num_blocks=3, medium="CPU")])
    router.remove_replica("a")  # its slots, the tier's too, are free again
    assert index.host_tiers == 0 and index.match_tiers(keys) == TierMatches({"b": 6}, {})
    assert sorted(index._free_slots) == sorted((entry.slot, entry.host.slot))
