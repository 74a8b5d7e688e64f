"""The default policy where several routers book on the same replicas (``ReplicaLoad.other_routers``, from the
published load's ``accepted``): with ``near_share`` its choice is drawn among the near-equal cheapest, so routers
deciding inside one burst on the same load do not all send it to one replica; a router alone chooses as before, and
without it (the default) every router takes the cheapest."""

from __future__ import annotations

import random

from kvmesh.events.load import ReplicaLoadUpdate
from kvmesh.events.publish.load_ledger import LoadLedger
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import READY, Replica
from kvmesh.router.routing import routable
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.load import LoadTracker
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensConfig, CacheAwareTokensPolicy
from kvmesh.router.routing.policies.cache_aware_tokens_columns import cheapest_rows
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates, plain
from .test_pruned_routing import BS, random_router

KEYS = list(range(64))  # a 1,024-token prompt
NO_CHURN = CacheAwareTokensConfig(churn_weight=0.0, decode_weight=0.0, near_share=0.15)


def _fleet(others: int, **queued: int) -> dict[str, ReplicaLoad]:
    """Four idle replicas (``queued``: prompt tokens queued on some), published with ``others`` other routers."""
    out = {f"r{i}": ReplicaLoad(evicting=1.0, other_routers=others) for i in range(4)}
    for rid, tokens in queued.items():
        out[rid].queued_prefill_tokens = tokens
    return out


def _picks(policy, fleet, matches=None, n=200) -> list[str]:
    return [policy.choose(KEYS, TierMatches(matches or {}), candidates(fleet)).id for _ in range(n)]


def test_a_router_alone_takes_the_cheapest_and_rotates_exact_ties():
    policy = CacheAwareTokensPolicy(NO_CHURN, BS, seed=1)
    assert set(_picks(policy, _fleet(0, r0=10, r1=20, r2=30, r3=40))) == {"r0"}  # r1 is 1.5 tokens dearer
    assert _picks(policy, _fleet(0), n=8) == ["r1", "r2", "r3", "r0"] * 2


def test_with_other_routers_the_choice_is_drawn_among_the_near_equal_only():
    policy = CacheAwareTokensPolicy(NO_CHURN, BS, seed=1)
    # near: within 0.15 x 1,024 uncached = 153.6 tokens of the cheapest; r3's 1,100 queued cost 165 more
    picks = _picks(policy, _fleet(1, r0=10, r1=20, r2=30, r3=1_100))
    assert set(picks) == {"r0", "r1", "r2"}
    assert min(picks.count(r) for r in ("r0", "r1", "r2")) > 30


def test_two_routers_on_one_load_do_not_rotate_in_step():
    a, b = (CacheAwareTokensPolicy(NO_CHURN, BS, seed=s) for s in (1, 2))
    same = sum(x == y for x, y in zip(_picks(a, _fleet(1)), _picks(b, _fleet(1)), strict=True))
    assert same < 100  # 1 in 4 by chance; in step (the rotation alone) they would agree 200 times


def test_a_cached_prefix_keeps_its_holder_whatever_the_router_count():
    policy = get_policy("cache_aware_tokens", CacheAwareTokensConfig(near_share=0.15), block_size=BS, seed=3)
    # the hostile case: a replica's feed claiming a thousand other routers only allows the draw among the near-equal
    assert set(_picks(policy, _fleet(1_000), {"r2": 60})) == {"r2"}


def test_by_default_every_router_takes_the_cheapest_with_other_routers_too():
    policy = CacheAwareTokensPolicy(CacheAwareTokensConfig(churn_weight=0.0, decode_weight=0.0), BS, seed=1)
    assert set(_picks(policy, _fleet(3, r0=10, r1=20, r2=30, r3=40))) == {"r0"}


def test_the_columns_find_the_near_equal_rows_the_walk_finds(monkeypatch):
    monkeypatch.setattr(routable, "COLUMNS_FROM", 1)
    for seed in range(25):
        rng = random.Random(seed)
        router, ids = random_router(rng)
        config = CacheAwareTokensConfig(near_share=rng.choice((0.0, 0.15, 1.0)))
        policy = CacheAwareTokensPolicy(config, BS, seed)
        prompt = rng.choice((5, 64, 600))
        device = {rid: rng.randint(0, prompt // BS) for rid in rng.sample(ids, rng.randint(0, len(ids)))}
        with router.lock:
            among = router.candidates(set())
        if not among:
            continue
        assert isinstance(among.loads, CandidateLoads)
        walk = policy._cheapest_walk(prompt, device, plain(among), config.near_share)
        assert cheapest_rows(config, BS, prompt, device, among.loads, config.near_share) == walk, seed


def test_the_tracker_counts_the_other_routers_the_replica_accepted_from():
    tracker = LoadTracker(router_id="me")
    tracker.replicas.add(Replica("r0", healthy=True, state=READY))
    ledger = LoadLedger()
    for router_id in ("me", "b", "c"):
        ledger.accept((router_id, 1), 100, 100, 0.0)
    update: ReplicaLoadUpdate = ledger.update(0.0, 0.0, 0, 3, 300, 0.1)
    tracker.apply_published(tracker.replicas.get("r0"), update, now=0.0)
    assert tracker.loads["r0"].other_routers == 2
