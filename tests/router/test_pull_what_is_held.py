"""A peer pull moves what its holder holds now: the blocks its events confirmed, not those the router credited it with
for a request still queued there (predictions). Priced as if they were there, an agent's next turn leaves the replica
still queueing its previous turn to pull a context that is not computed yet: the pull finds nothing to move and the
turn recomputes its whole context elsewhere (``kvmesh sim --workload tool_agent`` with 25 GB/s pulls and
``price_pulls``, arrival seed 0: 897 of 1,443 pulls would move nothing)."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.rivals import COMPARED
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost import PullPriors
from kvmesh.router.routing.cost.stored_tokens import stored_tokens
from kvmesh.router.routing.kv_placement import KVPlacementRules
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy, policy_config

from .helpers import stored
from .test_kv_transfer_decisions import TRANSFER, report

BS = 16
CONTEXT = list(range(1000, 1000 + 32 * BS))  # an agent's context: 32 blocks, the first 8 its system prompt
NEXT_TURN = CONTEXT + list(range(5000, 5000 + 3 * BS + 5))


def _router(price_pulls: bool) -> KVRouter:
    policy = get_policy("cache_aware_tokens", policy_config("cache_aware_tokens", {"price_pulls": price_pulls}), BS)
    router = KVRouter(block_size=BS, policy=policy, predict_ttl_s=10.0, transfers=KVPlacementRules())
    _replicas(router)
    return router


def _replicas(router: KVRouter) -> None:
    """a, b and c, idle, pulling at 10 GB/s; a computed the system prompt."""
    for rid in ("a", "b", "c"):
        router.add_replica(rid)
        router.loads.loads[rid].update_report(report())
        router.loads.loads[rid].update_transfer(TRANSFER)
    router.apply_events("a", [stored(CONTEXT[: 8 * BS], BS)])


def _queued_turn_on_b(router: KVRouter) -> None:
    """The agent's turn goes to b and waits in its queue: b is credited with the context, holds none of it yet."""
    assert router.route(CONTEXT, exclude={"a", "c"}, now=0.0).replica_id == "b"
    router.loads.loads["b"].update_report(report(waiting_prefill=20_000))


def test_the_router_matches_what_a_pull_can_move_when_its_policy_prices_pulls():
    router = _router(price_pulls=True)
    _queued_turn_on_b(router)
    keys = router.hasher.keys(NEXT_TURN, None, None, None)
    tiers = router.index.match_tiers(keys, now=0.5, pullable=True)
    assert tiers.device == {"a": 8, "b": 32}  # b credited with the queued turn's blocks
    assert tiers.pullable == {"a": 8, "b": 0}  # none of them there yet
    assert router.index.match_tiers(keys, now=0.5).pullable is None  # not asked: nothing computed


def test_no_pull_is_priced_or_planned_from_blocks_still_queued_on_their_holder():
    """b (20,000 tokens queued) was credited with the context; the next turn goes elsewhere for its load. Priced as
    pulled from b it would cost the others a quarter of the context; b holds none of it yet: no pull from b is planned,
    and the turn goes where its system prompt is (a)."""
    router = _router(price_pulls=True)
    _queued_turn_on_b(router)
    decision = router.route(NEXT_TURN, now=0.5)
    assert decision.replica_id == "a"
    assert decision.pull is None or decision.pull.holder.id != "b"


@pytest.mark.parametrize("name", ["cache_aware_tokens", "dynamo", "sglang", "least_loaded", "cache_aware"])
def test_every_policy_plans_its_pulls_from_held_blocks_alone(name):
    """The pull planner serves every policy (the default without ``price_pulls``, the rivals' formulas the simulator
    runs through the router): the next turn leaves b (100 requests in flight, this router's) for a, holding the system
    prompt, or c, holding nothing. b holds none of the context yet: a pulls nothing, c pulls the system prompt from a,
    the one replica holding it."""
    policy = get_policy(name, block_size=BS, registry=COMPARED)
    router = KVRouter(block_size=BS, policy=policy, predict_ttl_s=10.0, transfers=KVPlacementRules())
    _replicas(router)
    _queued_turn_on_b(router)
    for _ in range(100):
        router.loads.on_dispatch(router.replicas.get("b"), 200)
    decision = router.route(NEXT_TURN, now=0.5)
    assert decision.replica_id in ("a", "c")
    if decision.replica_id == "a":
        assert decision.pull is None
    else:
        assert (decision.pull.holder.id, decision.pull.num_tokens) == ("a", 8 * BS)


def test_a_pull_is_priced_over_the_held_blocks_alone():
    """b is credited with 60 blocks and holds 20 for real: the idle replica pulls 20 blocks' tokens (320), computes
    the rest (704)."""
    loads = {"b": _pulling(), "idle": _pulling()}
    out = stored_tokens(1024, {"b": 60}, loads, BS, PullPriors(True), 0.0, pullable={"b": 20})
    assert (out["idle"].pulled, out["idle"].computed) == (320, 704)
    assert stored_tokens(1024, {"b": 60}, loads, BS, PullPriors(True), 0.0, pullable={"b": 0})["idle"].pulled == 0
    assert stored_tokens(1024, {"b": 60}, loads, BS, PullPriors(True), 0.0)["idle"].pulled == 960  # not told: all


def _pulling() -> ReplicaLoad:
    return ReplicaLoad(prefill_tokens_per_s=10_000.0, kv_transfer_enabled=True, kv_block_bytes=1 << 20,
                       pull_bytes_per_s=1e10, pull_fixed_s=0.001)
