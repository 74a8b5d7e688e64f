"""What each replica evicts and whether it comes back (router/routing/eviction_ghosts.py), the router keeping it on
each replica's load from the events it applies, and the default policy pricing it and peer pulls
(router/routing/cost/stored_tokens.py), on hand-computed cases."""

from __future__ import annotations

import pytest
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost import PullPriors
from kvmesh.router.routing.cost.stored_tokens import stored_tokens
from kvmesh.router.routing.eviction_ghosts import EvictionGhosts
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy, policy_config
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates, removed, stored

BS = 16
TOKENS = list(range(4 * BS))  # four blocks


def test_a_block_stored_again_after_its_eviction_came_back():
    """Window 4 (each stored block weighs 1/4): two fresh blocks 0; one that came back 1/4; a fresh one after it
    3/4 of that."""
    ghosts, r = EvictionGhosts(capacity_blocks=16, window_blocks=4), ReplicaLoad()
    ghosts.apply(r, [stored(TOKENS, BS, 0, 2)])
    assert r.comeback == 0.0
    ghosts.apply(r, [removed(TOKENS, BS, [1])])
    ghosts.apply(r, [stored(TOKENS, BS, 1, 1)])
    assert r.comeback == pytest.approx(0.25)
    ghosts.apply(r, [stored(TOKENS, BS, 2, 1)])
    assert r.comeback == pytest.approx(0.25 * 0.75)
    assert (r.stored_blocks, r.came_back_blocks) == (4, 1) and ghosts.num_ghosts == 0  # its ghost consumed


def test_the_ghost_list_is_bounded_and_forgets_the_oldest():
    ghosts, r = EvictionGhosts(capacity_blocks=2, window_blocks=1), ReplicaLoad()
    ghosts.apply(r, [stored(TOKENS, BS), removed(TOKENS, BS, [0, 1, 2])])  # block 0's ghost pushed out
    assert ghosts.num_ghosts == 2
    ghosts.apply(r, [stored(TOKENS, BS, 0, 1)])
    assert r.comeback == 0.0  # forgotten: not a comeback
    ghosts.apply(r, [stored(TOKENS, BS, 1, 1)])
    assert r.comeback == 1.0  # window 1: the last stored block alone


def test_host_tier_events_and_resets_are_not_evictions():
    ghosts, r = EvictionGhosts(window_blocks=1), ReplicaLoad()
    ghosts.apply(r, [stored(TOKENS, BS), removed(TOKENS, BS, [0], medium="CPU")])
    ghosts.apply(r, [stored(TOKENS, BS, 0, 1)])
    assert r.comeback == 0.0
    ghosts.apply(r, [AllBlocksCleared()])  # a reset evicts nothing: what it dropped is no ghost
    ghosts.apply(r, [stored(TOKENS, BS, 1, 1)])
    assert r.comeback == 0.0
    with pytest.raises(ValueError, match="capacity_blocks"):
        EvictionGhosts(capacity_blocks=0)


def test_a_block_one_replica_evicted_comes_back_on_another():
    """A request moved away from its prefix brings the blocks its old replica lost back elsewhere."""
    ghosts, a, b = EvictionGhosts(capacity_blocks=1, window_blocks=1), ReplicaLoad(), ReplicaLoad()
    ghosts.apply(a, [stored(TOKENS, BS, 0, 1), removed(TOKENS, BS, [0])])
    ghosts.apply(b, [stored(TOKENS, BS, 1, 1), removed(TOKENS, BS, [1])])  # a list each
    assert ghosts.num_ghosts == 2
    ghosts.apply(b, [stored(TOKENS, BS, 0, 1)])
    assert b.comeback == 1.0 and a.comeback == 0.0 and ghosts.num_ghosts == 1


def test_each_replicas_ghosts_are_one_cache_deep():
    """A replica reporting 3 cache blocks (2 and its null block) keeps its last 2 evictions; one with 5 keeps 4, as
    deep as its cache: a block re-stored past its evicting cache's depth did not come back."""
    ghosts, small, big = EvictionGhosts(window_blocks=1), ReplicaLoad(num_kv_blocks=3), ReplicaLoad(num_kv_blocks=5)
    ghosts.apply(small, [stored(TOKENS, BS), removed(TOKENS, BS, [0, 1, 2])])  # block 0's ghost pushed out
    ghosts.apply(big, [stored(TOKENS, BS, salt="b"), removed(TOKENS, BS, [0, 1, 2], salt="b")])  # all three
    assert ghosts.num_ghosts == 5
    ghosts.apply(small, [stored(TOKENS, BS, 0, 1)])
    assert small.comeback == 0.0  # past the small cache's depth
    ghosts.apply(small, [stored(TOKENS, BS, 0, 1, salt="b")])
    assert small.comeback == 1.0  # within the big one's, wherever it comes back
    ghosts.forget(big)  # gone from the fleet: its ghosts with it
    assert ghosts.num_ghosts == 2
    ghosts.apply(small, [stored(TOKENS, BS, 1, 1, salt="b")])
    assert small.comeback == 0.0


def test_the_router_sizes_each_replicas_ghosts_by_its_reported_cache():
    router = KVRouter(block_size=BS, policy=_policy(ghost_weight=1.0))
    for rid in ("a", "b"):
        router.add_replica(rid)
    router.replicas.get("a").load.num_kv_blocks = 2  # one usable block
    router.apply_events("a", [stored(TOKENS, BS), removed(TOKENS, BS, [0, 1])])
    assert router.ghosts.num_ghosts == 1  # block 0 past a's one-block depth
    router.apply_events("b", [stored(TOKENS, BS, 0, 2)])
    load = router.replicas.get("b").load
    assert (load.stored_blocks, load.came_back_blocks) == (2, 1)
    router.apply_events("a", [removed(TOKENS, BS, [2])])
    router.remove_replica("a")
    assert router.ghosts.num_ghosts == 0


def test_the_router_keeps_comeback_on_the_replicas_load():
    router = KVRouter(block_size=BS, policy=_policy(ghost_weight=1.0))
    router.add_replica("a")
    router.apply_events("a", [stored(TOKENS, BS), removed(TOKENS, BS, [3]), stored(TOKENS, BS, 3, 1)])
    load = router.replicas.get("a").load
    assert load.comeback == pytest.approx(1 / 1024)  # one of five stored blocks, window 1024
    assert (load.stored_blocks, load.came_back_blocks) == (5, 1)
    router.apply_events("gone", [BlockRemoved(block_hashes=[1], medium="GPU")])  # unknown replica: ignored
    assert router.ghosts.num_ghosts == 0


@pytest.mark.parametrize("knobs", [{"ghost_weight": 0.0}, {"price_pulls": False}])
def test_a_policy_that_prices_no_eviction_keeps_no_ghosts(knobs):
    """With ``ghost_weight`` 0 (pulls priced or not), or unset with pulls unpriced, the router keeps no ghost list
    and no comeback: the events pay nothing for a term that is off."""
    router = KVRouter(block_size=BS, policy=_policy(**knobs))
    router.add_replica("a")
    router.apply_events("a", [stored(TOKENS, BS), removed(TOKENS, BS, [3]), stored(TOKENS, BS, 3, 1)])
    load = router.replicas.get("a").load
    assert router.ghosts is None
    assert (load.comeback, load.stored_blocks, load.came_back_blocks) == (0.0, 0, 0)
    assert router.index.num_blocks("a") == 4  # the index still applied them


def _policy(**knobs):
    return get_policy("cache_aware_tokens", policy_config("cache_aware_tokens", {"churn_weight": 0.0, **knobs}), BS)


def test_a_negative_ghost_weight_is_refused_by_name():
    with pytest.raises(ValueError, match="ghost_weight must be >= 0"):
        policy_config("cache_aware_tokens", {"ghost_weight": -1.0})


def test_a_token_no_replica_holds_is_not_damage():
    """No candidate holds the prompt: it is stored somewhere whichever takes it, so comeback prices nothing."""
    loads = {"thrashing": ReplicaLoad(comeback=0.5), "calm": ReplicaLoad()}
    assert _policy(ghost_weight=1.0).costs(list(range(64)), {},
                                           candidates(loads)) == {"thrashing": 1024.0, "calm": 1024.0}


def test_a_second_copy_costs_what_its_eviction_brings_back():
    """The holder (960 of 1024 tokens cached) has 8,000 queued tokens: 64 + 0.15 x 8000 = 1264 against the idle
    replica's 1024 (it wins without the damage). Evictions come back at 0.8 on average: the idle replica's copy of
    the 960 held tokens costs 0.8 x 960 more, 1792, and the request stays on its prefix. With nothing coming back,
    the copy costs nothing."""
    keys, tiers = list(range(64)), TierMatches({"holder": 60})
    loads = {"holder": ReplicaLoad(pending_prefill_tokens=8_000, comeback=0.6, evicting=1.0),
             "idle": ReplicaLoad(comeback=1.0, evicting=1.0)}
    costs = _policy(ghost_weight=1.0).costs(keys, {"holder": 60}, candidates(loads))
    assert costs == {"holder": pytest.approx(1264.0), "idle": pytest.approx(1024 + 0.8 * 960)}
    assert _policy(ghost_weight=1.0).choose(keys, tiers, candidates(loads)).id == "holder"
    assert _policy().choose(keys, tiers, candidates(loads)).id == "idle"  # unset: off without pulls
    loads = {"holder": ReplicaLoad(pending_prefill_tokens=8_000, evicting=1.0), "idle": ReplicaLoad(evicting=1.0)}
    assert _policy(ghost_weight=1.0).choose(keys, tiers, candidates(loads)).id == "idle"


def _pulling(**fields) -> ReplicaLoad:
    """A replica that can pull, its cache full (evicting: queued prefill at ``backlog_weight``)."""
    return ReplicaLoad(prefill_tokens_per_s=10_000.0, kv_transfer_enabled=True, kv_block_bytes=1 << 20,
                       pull_bytes_per_s=1e10, pull_fixed_s=0.001, **{"evicting": 1.0, **fields})


def test_a_pull_is_priced_at_its_share_of_the_compute_time():
    """60 blocks of 1 MiB at 10 GB/s + 1 ms = 7.29 ms against 960 tokens at 10k tokens/s = 96 ms."""
    loads = {"holder": _pulling(), "other": _pulling()}
    share = (60 * (1 << 20) / 1e10 + 0.001) / 0.096
    out = stored_tokens(1024, {"holder": 60}, loads, BS, PullPriors(True), ghost_weight=0.0)
    assert out["holder"].computed == 64 and out["holder"].pulled == 0 and out["holder"].price == 64
    assert out["other"].computed == 64 and out["other"].pulled == 960
    assert out["other"].price == pytest.approx(64 + 960 * share)
    assert stored_tokens(1024, {"holder": 60}, loads, BS, None, 0.0)["other"].price == 1024  # pulls off
    loads["holder"].kv_transfer_enabled = False  # nothing to pull from
    assert stored_tokens(1024, {"holder": 60}, loads, BS, PullPriors(True), 0.0)["other"].pulled == 0


def test_the_default_prices_a_pull():
    """The holder's 3,000 queued tokens (450 weighted) outweigh the idle replica's 64 + 73 for its pulled tokens."""
    loads = {"holder": _pulling(pending_prefill_tokens=12_000), "idle": _pulling()}
    keys, tiers = list(range(64)), TierMatches({"holder": 60})
    policy = _policy(price_pulls=True)
    policy.use_pulls(PullPriors(True))
    costs = policy.costs(keys, {"holder": 60}, candidates(loads))
    assert costs["idle"] == pytest.approx(64 + 960 * (60 * (1 << 20) / 1e10 + 0.001) / 0.096)
    assert policy.choose(keys, tiers,
                         candidates({"holder": _pulling(pending_prefill_tokens=3_000), "idle": _pulling()})).id \
        == "idle"  # 64 + 450 against 137
    unpriced = _policy(price_pulls=False)
    unpriced.use_pulls(PullPriors(True))
    assert unpriced.choose(keys, tiers,
                           candidates({"holder": _pulling(pending_prefill_tokens=3_000), "idle": _pulling()})).id \
        == "holder"  # 514 against 1024
