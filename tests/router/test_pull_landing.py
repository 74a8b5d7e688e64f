"""A pull still landing on a replica, priced by the default: a pulled request joins its replica's queue only when its
transfer ends, so a request sent there meanwhile computes first and the pulled one waits through every token of it.
The router counts the pulls landing on each replica (router/routing/pulls_landing.py); ``cache_aware_tokens`` adds a
candidate's computed tokens once per pull landing there (router/routing/cost/stored_tokens.py's path). Hand-computed
cases.

The case behind it (tests/sim/test_hostile_pull_pricing.py): with the router's admission on, a tenant's bursts of new
long prefixes had their later requests pulled onto idle replicas, a new burst's first request, computing its whole
prefix, was sent to a replica a pull was landing on, and the pulled request waited through that prefill."""

from __future__ import annotations

import dataclasses

import pytest
from kvmesh.router.routing.cost import PullPriors
from kvmesh.router.routing.kv_placement import KVPlacementRules
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy, policy_config
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates
from .test_kv_transfer_decisions import report
from .test_pull_what_is_held import CONTEXT, _replicas
from .test_pulls_priced import _pulling

BS = 16
KEYS = list(range(64))  # 1024 tokens no replica holds


def _default():
    policy = get_policy("cache_aware_tokens", policy_config("cache_aware_tokens", {"churn_weight": 0.0}), BS)
    policy.use_pulls(PullPriors(True))
    return policy


def test_a_request_computed_ahead_of_a_landing_pull_costs_its_tokens_once_more():
    """Both candidates compute all 1,024 tokens; ``other`` has 100 tokens queued (15 weighted): 1,039. ``landing``
    would cost 1,024, and a pull landing there waits through those 1,024 tokens: 2,048, so ``other`` gets it."""
    loads = {"landing": _pulling(landing_pulls=1), "other": _pulling(pending_prefill_tokens=100)}
    policy = _default()
    assert policy.costs(KEYS, {},
                        candidates(loads)) == {"landing": pytest.approx(2048.0), "other": pytest.approx(1039.0)}
    assert policy.choose(KEYS, TierMatches({}), candidates(loads)).id == "other"
    loads["landing"].landing_pulls = 0
    assert policy.choose(KEYS, TierMatches({}), candidates(loads)).id == "landing"  # 1,024 against 1,039


def test_two_landing_pulls_each_wait_and_a_long_queue_still_weighs_more():
    """Two pulls landing: 1,024 x 3 = 3,072; ``other`` with 15,000 queued tokens: 1,024 + 2,250 = 3,274."""
    loads = {"landing": _pulling(landing_pulls=2), "other": _pulling(pending_prefill_tokens=15_000)}
    assert _default().costs(KEYS, {},
                            candidates(loads)) == {"landing": pytest.approx(3072.0), "other": pytest.approx(3274.0)}
    assert _default().choose(KEYS, TierMatches({}), candidates(loads)).id == "landing"


def test_without_pulls_a_landing_count_is_not_priced():
    """Pulls off: the token formula alone (the count is never set then; set by hand here, it changes nothing)."""
    policy = get_policy("cache_aware_tokens", policy_config("cache_aware_tokens", {"churn_weight": 0.0}), BS)
    loads = {"landing": _pulling(landing_pulls=1), "other": _pulling(pending_prefill_tokens=100)}
    assert policy.costs(KEYS, {},
                        candidates(loads)) == {"landing": pytest.approx(1024.0), "other": pytest.approx(1039.0)}


def _router() -> KVRouter:
    router = KVRouter(block_size=BS, policy=_default(), predict_ttl_s=10.0, transfers=KVPlacementRules())
    _replicas(router)  # a holds the context's first 8 blocks; a, b and c pull at 10 GB/s
    router.loads.loads["a"].update_report(report(waiting_prefill=50_000))  # the context goes elsewhere and pulls
    return router


def test_the_router_counts_a_committed_pull_on_its_replica_until_its_priced_seconds_pass():
    router = _router()
    decision = router.route(CONTEXT, now=0.0)
    pull, load = decision.pull, decision.replica.load
    assert pull is not None and pull.holder.id == "a" and pull.pull_s > 0
    assert load.landing_pulls == 1
    router.route(CONTEXT[:BS], now=pull.pull_s / 2, commit=False)
    assert load.landing_pulls == 1  # still landing
    router.route(CONTEXT[:BS], now=pull.pull_s * 1.01, commit=False)
    assert load.landing_pulls == 0  # landed: forgotten


def test_a_decision_not_committed_counts_its_pull_only_once_committed():
    router = _router()
    decision = router.route(CONTEXT, now=0.0, commit=False)
    assert decision.pull is not None and decision.replica.load.landing_pulls == 0
    router.commit(decision, now=0.0)
    assert decision.replica.load.landing_pulls == 1


def test_a_pull_that_will_not_land_stops_counting_at_once_and_only_itself():
    """An attempt that fails or is cancelled before its replica answers never lands its pull: ``forget_pull`` takes
    that pull off its replica's count at once, not after its priced seconds; another pull there still counts."""
    router = _router()
    first = router.route(CONTEXT, now=0.0)
    assert first.pull is not None
    second = dataclasses.replace(first, pull=dataclasses.replace(first.pull))  # another request, the same pull
    router.commit(second, now=0.0)
    load = first.replica.load
    assert load.landing_pulls == 2
    router.forget_pull(first)
    assert load.landing_pulls == 1
    router.forget_pull(first)  # twice: nothing more
    assert load.landing_pulls == 1
    router.route(CONTEXT[:BS], now=0.0, commit=False)
    assert load.landing_pulls == 1  # the count before a decision agrees
    router.forget_pull(second)
    assert load.landing_pulls == 0 and not router.landing
