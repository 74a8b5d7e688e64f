"""The default policy's ``near_pick="prefix_hash"``: where several routers book on the same replicas, the choice
among the near-equal cheapest is a rendezvous hash of the prompt's first block no candidate holds, so every router
sends requests sharing a new prefix to the same replica and different prefixes spread; a router alone, a cached
prefix's holder and a replica beyond near-equal cost are untouched by it."""

from __future__ import annotations

import pytest
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensConfig, CacheAwareTokensPolicy
from kvmesh.router.routing.policies.prefix_rendezvous import new_prefix_key, rendezvous
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates
from .test_pruned_routing import BS

HASHED = CacheAwareTokensConfig(churn_weight=0.0, decode_weight=0.0, near_share=0.15, near_pick="prefix_hash")


def _fleet(others: int, ids=("r0", "r1", "r2", "r3"), **queued: int) -> dict[str, ReplicaLoad]:
    out = {rid: ReplicaLoad(evicting=1.0, other_routers=others) for rid in ids}
    for rid, tokens in queued.items():
        out[rid].queued_prefill_tokens = tokens
    return out


def _prompt(prefix: int) -> list[int]:
    """A 1,024-token prompt whose blocks all derive from ``prefix`` (a new prefix no replica holds)."""
    return [prefix * 1_000 + i for i in range(64)]


def _pick(policy, keys, fleet, matches=None) -> str:
    return policy.choose(keys, TierMatches(matches or {}), candidates(fleet)).id


def test_routers_agree_on_a_new_prefix_and_different_prefixes_spread():
    routers = [CacheAwareTokensPolicy(HASHED, BS, seed=s) for s in range(4)]
    picks = {p: {_pick(r, _prompt(p), _fleet(3)) for r in routers} for p in range(200)}
    assert all(len(chosen) == 1 for chosen in picks.values())  # every router, the same replica
    counts = [sum(chosen == {rid} for chosen in picks.values()) for rid in ("r0", "r1", "r2", "r3")]
    assert min(counts) > 25  # 50 each expected: spread, not one favourite


def test_only_the_near_equal_are_hashed_over():
    policy = CacheAwareTokensPolicy(HASHED, BS, seed=1)
    # r3's 1,100 queued tokens cost 165 more than r0's 10: beyond 0.15 x 1,024 = 153.6
    picks = [_pick(policy, _prompt(p), _fleet(1, r0=10, r1=20, r2=30, r3=1_100)) for p in range(200)]
    assert set(picks) == {"r0", "r1", "r2"}


def test_a_router_alone_takes_the_cheapest_and_rotates_exact_ties():
    policy = CacheAwareTokensPolicy(HASHED, BS, seed=1)
    assert {_pick(policy, _prompt(p), _fleet(0, r0=10, r1=20, r2=30, r3=40)) for p in range(50)} == {"r0"}
    assert [_pick(policy, _prompt(7), _fleet(0)) for _ in range(8)] == ["r1", "r2", "r3", "r0"] * 2


def test_a_feed_claiming_many_routers_cannot_move_a_cached_prefix_off_its_holder():
    policy = CacheAwareTokensPolicy(HASHED, BS, seed=3)
    assert {_pick(policy, _prompt(p), _fleet(1_000), {"r2": 60}) for p in range(200)} == {"r2"}


def _winning_id(key: int, others: list[str]) -> str:
    """A replica id chosen (by search) to win the rendezvous hash of ``key`` against ``others``."""
    for n in range(10_000):
        rid = f"evil{n}"
        if rendezvous(key, [Replica(r) for r in (*others, rid)]) == len(others):
            return rid
    raise AssertionError("no winning id found")


def test_an_id_chosen_to_win_the_hash_attracts_nothing_beyond_near_equal_cost():
    policy = CacheAwareTokensPolicy(HASHED, BS, seed=1)
    honest = ["r0", "r1", "r2"]
    prompts = [_prompt(p) for p in range(100)]
    evil = {new_prefix_key(k, {}): None for k in prompts}
    for key in evil:
        evil[key] = _winning_id(key, honest)
    for keys in prompts:
        rid = evil[new_prefix_key(keys, {})]
        fleet = _fleet(2, ids=(*honest, rid), r0=10, r1=20, r2=30)
        assert _pick(policy, keys, fleet) == rid  # within near-equal cost it wins, as any replica may
        fleet[rid].queued_prefill_tokens = 1_100  # 165 tokens dearer than r0: beyond near-equal
        assert _pick(policy, keys, fleet) in honest


def test_the_new_prefix_key_skips_the_blocks_some_candidate_holds():
    keys = _prompt(5)
    assert new_prefix_key(keys, {}) == keys[0]
    assert new_prefix_key(keys, {"r0": 3, "r1": 10}) == keys[10]
    assert new_prefix_key(keys, {"r0": 64}) == keys[-1]
    assert new_prefix_key([], {}) == 0


def test_the_hash_is_the_same_in_every_process():
    # known answers (blake2b and splitmix64, not Python's per-process salted str hash): routers in other processes
    # must agree, so the winners may not depend on anything but the key and the ids
    fleet = [Replica(rid) for rid in ("r0", "r1", "r2", "r3")]
    assert [rendezvous(k, fleet) for k in range(8)] == [2, 2, 0, 1, 0, 3, 2, 2]


def test_an_unknown_near_pick_is_refused():
    with pytest.raises(ValueError, match="near_pick must be one of random, prefix_hash"):
        CacheAwareTokensConfig(near_pick="roundrobin")
