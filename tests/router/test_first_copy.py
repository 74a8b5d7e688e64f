"""The default's cost while a fleet fills (router/routing/policies/cache_aware_tokens.py): a replica's turnover is
priced whole while any replica works, on an idle fleet as far as its KV events show it evicting
(``ReplicaLoad.evicting``, router/routing/evicting.py); with ``turnover_while_filling`` off, as far as it evicts or
the fleet is busy; with ``filling_backlog_weight`` 1 (an option) queued prefill counts in full while no candidate
evicts, so a prompt's next request goes to its holder unless the holder's queue costs more than recomputing its hit.
Hand-computed cases; the live one: tests/router/test_first_copy_live.py."""

from __future__ import annotations

import pytest
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.evicting import apply_evictions
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.policies.cache_aware_tokens_config import CacheAwareTokensConfig
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates

BS = 16
KEYS = list(range(64))  # a 1,024-token prompt
GATED = CacheAwareTokensConfig(turnover_while_filling=False)
"""Turnover priced as far as a replica evicts or the fleet is busy (the option these tests are about)."""


def _stored(first: int, n: int, medium: str = "GPU") -> BlockStored:
    return BlockStored(block_hashes=list(range(first, first + n)), parent_block_hash=None, token_ids=[],
                       block_size=BS, lora_id=None, medium=medium, lora_name=None)


def _evicting_stores(load: ReplicaLoad, n: int, window: int, medium: str = "GPU") -> None:
    """``n`` steps of a full cache: each stores a block and evicts one."""
    for i in range(n):
        apply_evictions(load, [BlockRemoved(block_hashes=[i], medium=medium), _stored(10_000 + i, 1, medium)], window)


def test_a_filling_cache_is_not_evicting_a_full_one_is_and_a_reset_empties_it():
    load = ReplicaLoad()
    apply_evictions(load, [_stored(0, 40)], window_blocks=8)
    assert load.evicting == 0.0  # 40 blocks stored, none removed: its cache had room
    _evicting_stores(load, 64, window=8)
    assert load.evicting == pytest.approx(1.0, abs=0.01)  # each block stored evicted one
    apply_evictions(load, [AllBlocksCleared()], window_blocks=8)
    assert load.evicting == 0.0 and load.evict_sums == [0.0, 0.0]


def test_the_share_follows_the_stores_that_evict_and_a_host_tier_is_not_the_device_cache():
    load = ReplicaLoad()
    for i in range(400):  # every other block stored evicts one
        apply_evictions(load, [_stored(i, 1)] + ([BlockRemoved(block_hashes=[i], medium="GPU")] if i % 2 else []),
                        window_blocks=64)
    assert load.evicting == pytest.approx(0.5, abs=0.05)
    host = ReplicaLoad()
    _evicting_stores(host, 64, window=8, medium="CPU")
    assert host.evicting == 0.0 and host.evict_sums == [0.0, 0.0]


def test_the_router_takes_a_replicas_evictions_from_the_events_it_applies():
    router = KVRouter(block_size=BS)
    router.add_replica("a")
    router.apply_events("a", [_stored(0, 8)])
    load = router.replicas.get("a").load
    assert load.evicting == 0.0
    router.apply_events("a", [BlockRemoved(block_hashes=[0, 1], medium="GPU"), _stored(100, 2)])
    assert 0.0 < load.evicting < 1.0  # 2 evictions over its last 10 stores, older ones decayed a little


def test_an_idle_fleet_keeps_a_conversation_on_the_replica_holding_it():
    """The live case: turn 1 went to ``holder``; its intake puts it at the churn clamp (2 per uncached token) and the
    other at the floor (1/2). Neither evicts, so each uncached token costs 1 on both: 1,024 - 80 cached against
    1,024, and turn 2 stays. On caches that evict, the turnover term still sends it away (944 x 2 > 1,024 / 2)."""
    policy = get_policy("cache_aware_tokens", GATED, block_size=BS)
    filling = {"holder": ReplicaLoad(recent_prefill=1024.0), "other": ReplicaLoad()}
    assert policy.costs(KEYS, {"holder": 5}, candidates(filling)) == {"holder": 944.0, "other": 1024.0}
    assert policy.choose(KEYS, TierMatches({"holder": 5}), candidates(filling)).id == "holder"
    full = {"holder": ReplicaLoad(recent_prefill=1024.0, evicting=1.0), "other": ReplicaLoad(evicting=1.0)}
    assert policy.costs(KEYS, {"holder": 5}, candidates(full)) == {"holder": 944.0 * 2, "other": 512.0}
    assert policy.choose(KEYS, TierMatches({"holder": 5}), candidates(full)).id == "other"


def test_turnover_counts_as_far_as_the_replica_is_evicting():
    """Half evicting: 1 + 1 x 0.5 x (2 - 1) = 1.5 per uncached token at the clamp, 1 + 0.5 x (1/2 - 1) = 0.75 at the
    floor (the backlog weight also sits halfway, but nothing is queued)."""
    loads = {"busy": ReplicaLoad(recent_prefill=1024.0, evicting=0.5), "idle": ReplicaLoad(evicting=0.5)}
    gated = get_policy("cache_aware_tokens", GATED, block_size=BS)
    assert gated.costs(KEYS, {}, candidates(loads)) == {"busy": 1536.0, "idle": 768.0}


FILLING = CacheAwareTokensConfig(filling_backlog_weight=1.0, turnover_while_filling=False)


@pytest.mark.parametrize("queued, chosen", [(959, "holder"), (961, "other")])
def test_while_the_fleet_fills_the_holder_keeps_a_request_unless_its_queue_costs_more_than_the_hit(queued, chosen):
    """The holder has 960 of the 1,024 tokens: 64 + its queue at full weight against 1,024 recomputed elsewhere
    (``filling_backlog_weight`` 1; unset, the queue weighs ``backlog_weight`` whether the caches fill or not)."""
    policy = get_policy("cache_aware_tokens", FILLING, block_size=BS)
    loads = {"holder": ReplicaLoad(queued_prefill_tokens=queued), "other": ReplicaLoad()}
    assert policy.costs(KEYS, {"holder": 60}, candidates(loads))["holder"] == 64 + queued
    assert policy.choose(KEYS, TierMatches({"holder": 60}), candidates(loads)).id == chosen
    unset = get_policy("cache_aware_tokens", GATED, block_size=BS)
    assert unset.costs(KEYS, {"holder": 60}, candidates(loads))["holder"] == pytest.approx(64 + 0.15 * queued)


def test_on_evicting_caches_the_queue_weighs_backlog_weight_and_in_between_by_the_mean_evicting():
    """The same 961 queued tokens: 0.15 x 961 on full caches, the holder keeps it; a fleet half evicting weighs the
    queue halfway between 0.15 and 1 (its mean evicting: one replica full, one filling)."""
    policy = get_policy("cache_aware_tokens", FILLING, block_size=BS)
    full = {"holder": ReplicaLoad(queued_prefill_tokens=961, evicting=1.0), "other": ReplicaLoad(evicting=1.0)}
    assert policy.costs(KEYS, {"holder": 60}, candidates(full))["holder"] == pytest.approx(64 + 0.15 * 961)
    assert policy.choose(KEYS, TierMatches({"holder": 60}), candidates(full)).id == "holder"
    half = {"holder": ReplicaLoad(queued_prefill_tokens=961, evicting=1.0), "other": ReplicaLoad()}
    assert policy.costs(KEYS, {"holder": 60}, candidates(half))["holder"] == pytest.approx(64 + 0.575 * 961)


def test_a_busy_fleet_prices_the_intake_of_a_replica_not_evicting_as_far_as_it_is_busy():
    """No cache evicts; one of the two replicas runs a request (busy = 1/2): 1 + 0.5 x (2 - 1) = 1.5 per uncached
    token at the clamp, 0.75 at the floor; 8 for the running request's step. ``busy_turnover`` off: 1 and 1."""
    loads = {"busy": ReplicaLoad(recent_prefill=1024.0, in_flight=1), "idle": ReplicaLoad()}
    gated = get_policy("cache_aware_tokens", GATED, block_size=BS)
    assert gated.costs(KEYS, {}, candidates(loads)) == {"busy": 1536.0 + 8, "idle": 768.0}
    off = get_policy("cache_aware_tokens", CacheAwareTokensConfig(busy_turnover=False, turnover_while_filling=False),
                     block_size=BS)
    assert off.costs(KEYS, {}, candidates(loads)) == {"busy": 1024.0 + 8, "idle": 1024.0}


def test_the_default_keeps_an_idle_holder_and_prices_turnover_whole_once_any_replica_works():
    """The default on an idle fleet, the prompt held by one replica: neither replica evicts, nothing is queued or
    running, so each uncached token costs 1 on both and turn 2 stays on its holder. One request running anywhere
    (here on the other replica) and the turnover counts whole on every replica, evicting or not: the holder at the
    clamp (2 per uncached token), the other at the floor (1/2, plus 8 for the running request's step).
    ``idle_turnover`` prices it whole on the idle fleet too."""
    policy = get_policy("cache_aware_tokens", block_size=BS)
    idle = {"holder": ReplicaLoad(recent_prefill=1024.0), "other": ReplicaLoad()}
    assert policy.costs(KEYS, {"holder": 5}, candidates(idle)) == {"holder": 944.0, "other": 1024.0}
    assert policy.choose(KEYS, TierMatches({"holder": 5}), candidates(idle)).id == "holder"
    working = {"holder": ReplicaLoad(recent_prefill=1024.0), "other": ReplicaLoad(in_flight=1)}
    assert policy.costs(KEYS, {"holder": 5}, candidates(working)) == {"holder": 944.0 * 2, "other": 512.0 + 8}
    assert policy.choose(KEYS, TierMatches({"holder": 5}), candidates(working)).id == "other"
    whole = get_policy("cache_aware_tokens", CacheAwareTokensConfig(idle_turnover=True), block_size=BS)
    assert whole.costs(KEYS, {"holder": 5}, candidates(idle)) == {"holder": 944.0 * 2, "other": 512.0}


def test_on_an_idle_fleet_a_prompt_no_replica_holds_still_goes_where_intake_is_lowest():
    """No candidate holds a block of the prompt: nothing to keep, and the turnover term still spreads the intake (2 per
    token on the replica that took the last prompt, 1/2 on the other), as it does on a working fleet."""
    policy = get_policy("cache_aware_tokens", block_size=BS)
    idle = {"holder": ReplicaLoad(recent_prefill=1024.0), "other": ReplicaLoad()}
    assert policy.costs(KEYS, {}, candidates(idle)) == {"holder": 1024.0 * 2, "other": 512.0}
    assert policy.choose(KEYS, TierMatches({}), candidates(idle)).id == "other"
