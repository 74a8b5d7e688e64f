"""Routing policies with fake loads: the cache/load trade-off and the baselines (``cache_aware_tokens``: the
token cost with hand-tuned weights, kept for comparison; ``cache_aware`` in seconds: tests/router/test_cost.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import READY, Replica
from kvmesh.router.routing.load import LoadTracker
from kvmesh.router.routing.policies import POLICIES, NoReplicaError, get_policy
from kvmesh.router.routing.policies.cache_aware import CacheAwareConfig
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensConfig
from kvmesh.router.routing.policies.prefix_hash import PrefixHashConfig
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates

BS = 16
KEYS = list(range(64))  # a 1,024-token prompt


def loads(n=2, evicting=1.0, **per_replica):
    """``n`` replicas' loads, each evicting as given (1: full caches, where the default's weights were tuned; its
    filling fleet: tests/router/test_first_copy.py), then ``per_replica``'s fields set."""
    out = {f"r{i}": ReplicaLoad(evicting=evicting) for i in range(n)}
    for rid, kw in per_replica.items():
        for k, v in kw.items():
            setattr(out[rid], k, v)
    return out


def test_cache_aware_prefers_replica_holding_the_prefix():
    policy = get_policy("cache_aware", block_size=BS)
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(loads(3))).id == "r1"


def test_cache_aware_tokens_leaves_prefix_when_backlog_outweighs_saved_prefill():
    policy = get_policy("cache_aware_tokens", CacheAwareTokensConfig(decode_weight=0, backlog_weight=1.0),
                        block_size=BS)
    saved = 40 * BS
    assert policy.choose(KEYS, TierMatches({"r1": 40}),
                         candidates(loads(2, r1={"queued_prefill_tokens": saved - 1}))).id == "r1"
    assert policy.choose(KEYS, TierMatches({"r1": 40}),
                         candidates(loads(2, r1={"queued_prefill_tokens": saved + 1}))).id == "r0"


def test_cache_aware_tokens_trade_off_is_continuous_in_decode_load():
    policy = get_policy("cache_aware_tokens", CacheAwareTokensConfig(decode_weight=32), block_size=BS)
    saved = 40 * BS  # = 20 running requests' worth
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(loads(2, r1={"in_flight": 19}))).id == "r1"
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(loads(2, r1={"in_flight": 21}))).id == "r0"
    assert policy.choose(KEYS, TierMatches({"r1": 40}), candidates(loads(2, r1={"num_running": 21}))).id == "r0"
    assert saved == 20 * 32


def test_cache_aware_tokens_backlog_weight_scales_queued_prefill():
    policy = get_policy("cache_aware_tokens", CacheAwareTokensConfig(decode_weight=0, backlog_weight=0.5),
                        block_size=BS)
    saved = 40 * BS
    assert policy.choose(KEYS, TierMatches({"r1": 40}),
                         candidates(loads(2, r1={"queued_prefill_tokens": 2 * saved - 2}))).id == "r1"
    assert policy.choose(KEYS, TierMatches({"r1": 40}),
                         candidates(loads(2, r1={"queued_prefill_tokens": 2 * saved + 2}))).id == "r0"


def test_cache_aware_tokens_router_pending_prefill_counts_as_backlog():
    policy = get_policy("cache_aware_tokens", CacheAwareTokensConfig(decode_weight=0), block_size=BS)
    busy = loads(2, r1={"pending_prefill_tokens": 10_000})
    assert policy.choose(KEYS, TierMatches({"r1": 64}), candidates(busy)).id == "r0"


def test_cache_aware_ties_rotate_over_idle_replicas():
    policy = get_policy("cache_aware", block_size=BS)
    picks = {policy.choose(KEYS, TierMatches({}), candidates(loads(4))).id for _ in range(8)}
    assert picks == {"r0", "r1", "r2", "r3"}


def test_cache_aware_temperature_samples_near_equal_replicas():
    policy = get_policy("cache_aware", CacheAwareConfig(temperature=50.0), block_size=BS, seed=1)
    near = loads(3, r2={"queued_prefill_tokens": 100_000})
    picks = [policy.choose(KEYS, TierMatches({"r0": 1}), candidates(near)).id for _ in range(200)]
    assert {"r0", "r1"} <= set(picks) and "r2" not in picks


def test_least_loaded_ignores_cache():
    policy = get_policy("least_loaded")
    assert policy.choose(KEYS, TierMatches({"r1": 64}), candidates(loads(2, r1={"in_flight": 1}))).id == "r0"


def test_round_robin_cycles():
    policy = get_policy("round_robin")
    assert [policy.choose(KEYS, TierMatches({}), candidates(loads(3))).id for _ in range(6)] == ["r0", "r1", "r2"] * 2


def test_random_is_seeded():
    a = [get_policy("random", seed=3).choose(KEYS, TierMatches({}), candidates(loads(5))).id for _ in range(5)]
    b = [get_policy("random", seed=3).choose(KEYS, TierMatches({}), candidates(loads(5))).id for _ in range(5)]
    assert a == b


def test_prefix_hash_keeps_a_prefix_together_and_moves_little_on_removal():
    policy = get_policy("prefix_hash", PrefixHashConfig(prefix_blocks=2))
    prompts = [[i * 1000 + j for j in range(8)] for i in range(200)]
    first = {i: policy.choose(p, TierMatches({}), candidates(loads(10))).id for i, p in enumerate(prompts)}
    assert first == {i: policy.choose(p, TierMatches({}), candidates(loads(10))).id for i, p in enumerate(prompts)}
    assert policy.choose([prompts[0][0], prompts[0][1], 999], TierMatches(), candidates(loads(10))).id == first[0]
    fewer = loads(10)
    del fewer["r3"]
    moved = sum(policy.choose(p, TierMatches({}), candidates(fewer)).id != first[i] for i, p in enumerate(prompts))
    assert moved == sum(v == "r3" for v in first.values())


def test_prefix_hash_in_a_router_sends_each_prompt_where_a_ring_of_the_candidates_alone_would():
    """The router's policy rings every replica of its set and walks to the first candidate: the same choice as a
    ring of this call's candidates, whoever is unhealthy, excluded, out of the pool or of role prefill; a replica
    that joins or leaves changes the ring."""
    import random

    from kvmesh.router.routing.kv_router import KVRouter

    router = KVRouter(block_size=BS, policy=get_policy("prefix_hash", PrefixHashConfig(prefix_blocks=2)))
    for i in range(8):
        router.add_replica(f"r{i}", role="prefill" if i == 7 else "both")
    alone = get_policy("prefix_hash", PrefixHashConfig(prefix_blocks=2))  # no router: rings its candidates
    rng = random.Random(5)
    prompts = [[rng.getrandbits(63) for _ in range(3)] for _ in range(60)]
    for trial in range(30):
        if trial == 10:
            router.add_replica("r8")
        if trial == 20:
            router.remove_replica("r2")
        down = rng.sample([r.id for r in router.replicas], 2)
        for rid in down:
            router.set_healthy(router.replicas.get(rid), False)
        exclude = set(rng.sample([r.id for r in router.replicas], 1))
        with router.lock:
            among = router.candidates(exclude)
            expected = [alone.choose(p, TierMatches(), among).id for p in prompts]
            chosen = [router.policy.choose(p, TierMatches(), among).id for p in prompts]
        assert chosen == expected, trial
        assert "r7" not in chosen and not set(chosen) & set(down) and not set(chosen) & exclude
        for rid in down:
            router.set_healthy(router.replicas.get(rid), True)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_raises_without_candidates(name):
    with pytest.raises(NoReplicaError):
        get_policy(name).choose(KEYS, TierMatches({}), candidates({}))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_picks_among_a_thousand_replicas(name):
    many = loads(1000)
    assert get_policy(name).choose(KEYS, TierMatches({"r7": 3}), candidates(many)).id in many


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="cache_aware"):
        get_policy("nope")


def test_cache_aware_tokens_sends_new_work_to_the_replica_whose_cache_turns_over_slowest():
    policy = get_policy("cache_aware_tokens", CacheAwareTokensConfig(churn_weight=1.0), block_size=BS)
    churned = loads(3, r0={"recent_prefill": 3000.0}, r1={"recent_prefill": 1000.0}, r2={"recent_prefill": 2000.0})
    assert policy.choose(KEYS, TierMatches({}), candidates(churned)).id == "r1"
    assert {policy.choose(KEYS, TierMatches({}), candidates(churned)).id for _ in range(3)} == {"r1"}
    blind = get_policy("cache_aware_tokens", CacheAwareTokensConfig(churn_weight=0.0), block_size=BS)
    assert {blind.choose(KEYS, TierMatches({}),
                         candidates(churned)).id for _ in range(3)} == {"r0", "r1", "r2"}  # ties rotate


def test_cache_aware_tokens_churn_does_not_move_a_request_off_its_cached_prefix():
    policy = get_policy("cache_aware_tokens", CacheAwareTokensConfig(churn_weight=1.0), block_size=BS)
    churned = loads(2, r0={"recent_prefill": 9000.0}, r1={"recent_prefill": 1000.0})
    assert policy.choose(KEYS, TierMatches({"r0": 60}), candidates(churned)).id == "r0"


def test_load_tracker_recent_prefill_decays_with_its_time_constant():
    tracker = LoadTracker(churn_tau_s=10.0)
    for rid in ("a", "b"):
        tracker.replicas.add(Replica(rid, healthy=True, state=READY))
    tracker.on_dispatch(tracker.replicas.get("a"), 1000, now=0.0)
    tracker.on_dispatch(tracker.replicas.get("b"), 1000,
                        now=10.0)  # as recent as it gets: a's tokens have decayed by e since
    ratio = tracker.loads["b"].recent_prefill / tracker.loads["a"].recent_prefill
    assert ratio == pytest.approx(math.e)
    tracker.on_dispatch(tracker.replicas.get("a"), 1000,
                        now=1e7)  # far later: rebased, no overflow; b's old tokens forgotten
    assert tracker.loads["a"].recent_prefill == pytest.approx(1000.0) and tracker.loads["b"].recent_prefill < 1e-50


def test_cache_aware_tokens_backlog_release_point_makes_a_hot_replica_shed_requests():
    kept_config = CacheAwareTokensConfig(decode_weight=0, backlog_weight=0.1, churn_weight=0)
    kept = get_policy("cache_aware_tokens", kept_config, block_size=BS)
    shed = get_policy("cache_aware_tokens", replace(kept_config, backlog_release_tokens=1000), block_size=BS)
    hot = loads(2, r1={"queued_prefill_tokens": 3000})  # saved 640 tokens vs 300 (kept) or 300 + 1800 (shed)
    assert kept.choose(KEYS, TierMatches({"r1": 40}), candidates(hot)).id == "r1"
    assert shed.choose(KEYS, TierMatches({"r1": 40}), candidates(hot)).id == "r0"
    assert shed.costs(KEYS, {"r1": 40}, candidates(hot))["r1"] == pytest.approx(384 + 300 + 0.9 * 2000)


def test_cache_aware_tokens_running_requests_weigh_once_per_step_until_our_prefill_is_done():
    no_backlog = CacheAwareTokensConfig(backlog_weight=0, churn_weight=0)
    policy = get_policy("cache_aware_tokens", replace(no_backlog, decode_step_tokens=256), block_size=BS)
    one_step = get_policy("cache_aware_tokens", replace(no_backlog, decode_step_tokens=math.inf), block_size=BS)
    short = loads(2, r1={"in_flight": 3})  # r1 holds 60 of 64 blocks: 64 tokens left, under one step
    assert policy.costs(KEYS, {"r1": 60}, candidates(short))["r1"] == 64 + 3 * 8
    queued = loads(2, r1={"in_flight": 40, "queued_prefill_tokens": 1984})  # (1984 + 64) / 256 = 8 steps
    assert policy.costs(KEYS, {"r1": 60}, candidates(queued))["r1"] == 64 + 40 * 8 * 8
    assert policy.choose(KEYS, TierMatches({"r1": 60}),
                         candidates(queued)).id == "r0"  # 1,024 tokens on the idle replica are sooner
    assert one_step.choose(KEYS, TierMatches({"r1": 60}), candidates(queued)).id == "r1"


def test_cache_aware_tokens_choice_is_the_minimum_of_its_reported_costs():
    import random

    rng = random.Random(5)
    for policy in (get_policy("cache_aware_tokens", CacheAwareTokensConfig(backlog_release_tokens=2000), block_size=BS),
                   get_policy("cache_aware_tokens", CacheAwareTokensConfig(decode_step_tokens=1000), block_size=BS)):
        _check_choice_is_min_cost(policy, rng)


def _check_choice_is_min_cost(policy, rng):
    for _ in range(200):
        many = loads(8, **{f"r{i}": {"recent_prefill": rng.uniform(0, 5000), "in_flight": rng.randrange(20),
                                     "queued_prefill_tokens": rng.randrange(6000)} for i in range(8)})
        matches = {f"r{i}": rng.randrange(65) for i in range(8) if rng.random() < 0.5}
        costs = policy.costs(KEYS, matches, candidates(many))
        assert costs[policy.choose(KEYS, TierMatches(matches),
                                   candidates(many)).id] == pytest.approx(min(costs.values()))


def test_cache_aware_tokens_turnover_spread_outweighs_a_hit_of_three_quarters_of_the_prompt():
    """On caches that evict (``loads``' default): a tenant's second request arrives while r0, the only replica that
    took in its tokens, still computes the first. r0 holds three quarters of the prompt, but its intake puts it at the
    churn clamp (2 per uncached token) and an idle replica at the floor (1/2): a spread of 4 that a hit saving 3/4 of
    the prompt cannot outweigh, so the request and a copy of the prompt go to an idle replica. Without the turnover
    term it stays. On an idle fleet whose caches fill, none is priced (tests/router/test_first_copy.py)."""
    fleet = loads(4, r0={"pending_prefill_tokens": 1024, "in_flight": 1, "recent_prefill": 1024.0})
    policy = get_policy("cache_aware_tokens", block_size=BS)  # the defaults: churn_weight 1, churn_clamp 2
    idle = 1024 / 2
    assert policy.costs(KEYS, {"r0": 48}, candidates(fleet)) == pytest.approx(
        {"r0": 256 * 2 + 0.15 * 1024 + 8, "r1": idle, "r2": idle, "r3": idle})  # 8: one running request, one step
    assert policy.choose(KEYS, TierMatches({"r0": 48}), candidates(fleet)).id != "r0"
    blind = get_policy("cache_aware_tokens", CacheAwareTokensConfig(churn_weight=0.0), block_size=BS)
    assert blind.choose(KEYS, TierMatches({"r0": 48}), candidates(fleet)).id == "r0"


def test_cache_aware_tokens_queue_share_prices_a_holders_requests_where_they_overflow_its_cache():
    """A holder of three quarters of the prompt with six requests in flight, each a cache hit with little left to
    prefill, its KV cache 2,048 tokens against their 1,024-token prompts (the rest wait for its blocks, as where a
    cache holds a request or two): the default keeps the request there; ``queue_share_weight`` adds its share of the
    prompt for the holder's requests against the fewest on any candidate, times how far they overflow its cache (six
    prompts in two prompts' room: three times over, clamped to 1), and at 1 that outweighs the hit. Where the cache
    holds them all it adds nothing; where all candidates have as many, nothing either."""
    base = CacheAwareTokensConfig(churn_weight=0.0)
    held = {"pending_prefill_tokens": 6 * 64, "in_flight": 6, "recent_prompt": 6 * 1024.0, "recent_requests": 6.0}
    fleet = loads(2, r0=held | {"num_kv_blocks": 128}, r1={"num_kv_blocks": 128})
    kept = 256 + 0.15 * 6 * 64 + 8 * 6
    default = get_policy("cache_aware_tokens", base, block_size=BS)
    assert default.costs(KEYS, {"r0": 48}, candidates(fleet)) == pytest.approx({"r0": kept, "r1": 1024})
    assert default.choose(KEYS, TierMatches({"r0": 48}), candidates(fleet)).id == "r0"
    half = get_policy("cache_aware_tokens", replace(base, queue_share_weight=0.5), block_size=BS)
    assert half.costs(KEYS, {"r0": 48}, candidates(fleet)) == pytest.approx({"r0": kept + 512, "r1": 1024})
    assert half.choose(KEYS, TierMatches({"r0": 48}), candidates(fleet)).id == "r0"
    whole = get_policy("cache_aware_tokens", replace(base, queue_share_weight=1.0), block_size=BS)
    assert whole.choose(KEYS, TierMatches({"r0": 48}), candidates(fleet)).id == "r1"
    between = loads(2, r0=held | {"num_kv_blocks": 256})  # 6 x 1,024 in 4,096 tokens: overflow 0.5
    assert whole.costs(KEYS, {"r0": 48}, candidates(between))["r0"] == pytest.approx(kept + 512)
    roomy = loads(2, r0=held | {"num_kv_blocks": 8192})  # every request fits: a prefill queue, the backlog's
    assert whole.costs(KEYS, {"r0": 48}, candidates(roomy)) == default.costs(KEYS, {"r0": 48}, candidates(roomy))
    everywhere = get_policy("cache_aware_tokens", replace(base, queue_share_weight=1.0, queue_share_overflow=False),
                            block_size=BS)
    assert everywhere.costs(KEYS, {"r0": 48}, candidates(roomy))["r0"] == pytest.approx(kept + 1024)
    alike = loads(2, r0=held | {"num_kv_blocks": 128}, r1=held | {"num_kv_blocks": 128})
    assert whole.costs(KEYS, {"r0": 48}, candidates(alike)) == default.costs(KEYS, {"r0": 48}, candidates(alike))
    with pytest.raises(ValueError, match="queue_share_weight"):
        CacheAwareTokensConfig(queue_share_weight=-1)
