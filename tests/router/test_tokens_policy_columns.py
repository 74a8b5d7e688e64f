"""``cache_aware_tokens`` (the default) prices its candidates in one numpy pass over the load columns when the
router hands it ``CandidateLoads``: its choices equal the one-by-one loop's over a plain dict, on randomized fleets
(queued and pending prefill, other router workers' in-flight requests, churn, caches filling, full or between, caches
their requests overflow or not, backlogs past the release point, a queue tail lifting the load weight, identical
replicas that tie, idle replicas and idle fleets), and its costs are ``costs()``'s."""

from __future__ import annotations

import math
import random

import pytest
from kvmesh.router.routing import routable
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.policies import cache_aware_tokens
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensConfig, CacheAwareTokensPolicy
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import plain
from .test_pruned_routing import BS, random_router


@pytest.fixture(autouse=True)
def columns_at_any_size(monkeypatch):
    monkeypatch.setattr(routable, "COLUMNS_FROM", 1)
    monkeypatch.setattr(cache_aware_tokens, "COLUMNS_FROM_CANDIDATES", 1)


def _config(rng: random.Random) -> CacheAwareTokensConfig:
    return CacheAwareTokensConfig(churn_weight=rng.choice((0.0, 1.0, 0.3)), churn_clamp=rng.choice((1.0, 2.0, 4.0)),
                                  filling_backlog_weight=rng.choice((1.0, 0.15, 0.5)),
                                  backlog_release_tokens=rng.choice((math.inf, 100.0, 0.0)),
                                  decode_step_tokens=rng.choice((8192, 48, 7.5)),
                                  turnover_while_filling=rng.random() < 0.7, idle_turnover=rng.random() < 0.3,
                                  busy_turnover=rng.random() < 0.7,
                                  queue_share_weight=rng.choice((0.0, 0.0, 0.15, 1.0)),
                                  queue_share_overflow=rng.random() < 0.7,
                                  tail_knee=rng.choice((None, None, 0.1)), tail_weight=rng.choice((1.0, 0.5, 0.1)))


def _lifted(policies, rng: random.Random) -> None:
    """The same queue tail's lift on each policy (``tail_knee``: what its router measured), 0 to 1."""
    lift = rng.choice((0.0, 1.0, rng.random()))
    for policy in policies:
        if policy.tail is not None:
            policy.tail.lift = lift


def _idle(router, rng: random.Random) -> None:
    """Some replicas with nothing at all: no backlog, no requests, no churn (ties among them); in some fleets every
    replica idle with its churn kept (turnover then counts only as far as a replica evicts)."""
    loads = list(router.loads.loads.values())
    whole = rng.random() < 0.2
    for load in loads if whole else rng.sample(loads, len(loads) // 4):
        load.in_flight = load.num_running = load.num_waiting = load.peer_in_flight = 0
        load.pending_prefill_tokens = load.queued_prefill_tokens = 0
        if not whole:
            load.recent_prefill = 0.0


def _evicting(router, rng: random.Random) -> None:
    """Each replica's cache filling (0), full (1) or between; all filling in some fleets."""
    filling = rng.random() < 0.25
    for load in router.loads.loads.values():
        load.evicting = 0.0 if filling else rng.choice((0.0, 1.0, rng.random()))


def _caches(router, rng: random.Random) -> None:
    """Each replica's KV cache size as reported: none (0), a few blocks (its requests overflow it) or room."""
    for load in router.loads.loads.values():
        load.num_kv_blocks = rng.choice((0, 4, 64, 256, 4096))


def test_the_columns_choose_what_the_loop_chooses_on_random_fleets():
    compared = 0
    for seed in range(300):
        rng = random.Random(seed)
        router, ids = random_router(rng)
        _idle(router, rng)
        _evicting(router, rng)
        _caches(router, rng)
        config = _config(rng)
        fast, full = CacheAwareTokensPolicy(config, BS, seed), CacheAwareTokensPolicy(config, BS, seed)
        _lifted((fast, full), rng)
        for _ in range(6):
            prompt = rng.choice((0, 5, 64, 600))
            device = {rid: rng.randint(0, prompt // BS + 2) for rid in rng.sample(ids, rng.randint(0, len(ids)))}
            with router.lock:
                among = router.candidates(set())
            if not among:
                break
            assert isinstance(among.loads, CandidateLoads)
            keys = list(range(prompt // BS))
            chosen = fast.choose(keys, TierMatches(device), among, prompt)
            assert chosen is full.choose(keys, TierMatches(device), plain(among), prompt), seed
            compared += 1
            load = chosen.load  # the chosen replica gets busier, as a dispatch makes it
            load.in_flight += 1
            load.pending_prefill_tokens += prompt
    assert compared > 1000


def test_the_chosen_replica_is_the_cheapest_by_costs():
    for seed in range(100):
        rng = random.Random(seed)
        router, ids = random_router(rng)
        _evicting(router, rng)
        _caches(router, rng)
        policy = CacheAwareTokensPolicy(_config(rng), BS, seed)
        _lifted((policy,), rng)
        prompt = rng.choice((5, 64, 600))
        device = {rid: rng.randint(0, prompt // BS) for rid in rng.sample(ids, rng.randint(0, len(ids)))}
        with router.lock:
            among = router.candidates(set())
        if not among:
            continue
        costs = policy.costs(list(range(prompt // BS)), device, plain(among), prompt)
        chosen = policy.choose(list(range(prompt // BS)), TierMatches(device), among, prompt)
        assert costs[chosen.id] == min(costs.values()), seed
