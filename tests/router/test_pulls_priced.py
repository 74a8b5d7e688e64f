"""The default policy with peer pulls on: a prefix a candidate could pull from its holder is priced as pulled onto a
candidate with no prefill queued, and the copy it makes costs what its evictions bring back
(router/routing/cost/stored_tokens.py); without pulls its cost is the token formula alone. Hand-computed cases.

The case behind it (``kvmesh sim --workload mooncake --time-scale 0.5 --peer-pulls --kv-transfer-bytes-per-s 25e9
--arrival-seed 0``): a conversation's next turn whose 60 leading blocks of 512 tokens sit on a replica with 84,692
prompt tokens queued. With ``price_pulls=false`` an idle replica is priced as computing them (30,964 tokens), the
queued one at 0.15 x 84,692 + 244 = 13,130, and the turn waits 6.7 s there; an idle replica pulls them in 0.16 s.
``dynamo`` counts a queue in full, sends such a turn away, and the router's pull makes that cheap."""

from __future__ import annotations

import pytest
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost import PullPriors
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy, policy_config
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates, removed, stored

BS = 16
KEYS = list(range(64))  # 1024 tokens, the holder has 60 blocks (960 tokens) of them
TIERS = TierMatches({"holder": 60}, pullable={"holder": 60})
SHARE = (60 * (1 << 20) / 1e10 + 0.001) / 0.096
"""60 blocks of 1 MiB at 10 GB/s + 1 ms against 960 tokens at 10k tokens/s."""


def _pulling(**fields) -> ReplicaLoad:
    """A replica that can pull, its cache full (evicting: queued prefill at ``backlog_weight``)."""
    return ReplicaLoad(prefill_tokens_per_s=10_000.0, kv_transfer_enabled=True, kv_block_bytes=1 << 20,
                       pull_bytes_per_s=1e10, pull_fixed_s=0.001, **{"evicting": 1.0, **fields})


def _default(pulls: PullPriors | None = PullPriors(True), **knobs):
    policy = get_policy("cache_aware_tokens", policy_config("cache_aware_tokens", {"churn_weight": 0.0, **knobs}), BS)
    policy.use_pulls(pulls)
    return policy


def test_the_default_leaves_a_queued_holder_for_an_idle_replica_that_pulls():
    """The holder's 5,000 queued tokens weigh 750: 64 + 750 = 814 against the idle replica's 1024 priced as
    computed; pulled, its 960 tokens cost their pull's share of computing them, 64 + 73 = 137."""
    loads = {"holder": _pulling(pending_prefill_tokens=5_000), "idle": _pulling()}
    policy = _default()
    assert policy.costs(KEYS, TIERS.device, candidates(loads), pullable=TIERS.pullable) == {
        "holder": pytest.approx(814.0), "idle": pytest.approx(64 + 960 * SHARE)}
    assert policy.choose(KEYS, TIERS, candidates(loads)).id == "idle"
    assert _default(price_pulls=False).choose(KEYS, TIERS, candidates(loads)).id == "holder"  # 814 against 1024


def test_a_pull_is_not_priced_onto_a_replica_that_queues_the_request_too():
    """A receiver with 4,000 queued tokens would wait anyway, and its queued requests' prefixes sit in its cache
    unreferenced while they wait: the copy is priced as computed there, 1024 + 600, and the holder keeps it."""
    loads = {"holder": _pulling(pending_prefill_tokens=5_000), "busy": _pulling(pending_prefill_tokens=4_000)}
    policy = _default()
    assert policy.costs(KEYS, TIERS.device, candidates(loads), pullable=TIERS.pullable)["busy"] == pytest.approx(1624.0)
    assert policy.choose(KEYS, TIERS, candidates(loads)).id == "holder"


def test_the_copy_a_pull_makes_costs_what_its_evictions_bring_back():
    """Evictions come back at 0.8 (the candidates' mean): the idle replica's copy of 960 tokens costs 768 more,
    137 + 768 = 905 against the holder's 814; ``ghost_weight`` set prices it at that weight instead."""
    loads = {"holder": _pulling(pending_prefill_tokens=5_000, comeback=0.8),
             "idle": _pulling(comeback=0.8)}
    assert _default().costs(KEYS, TIERS.device, candidates(loads), pullable=TIERS.pullable)["idle"] == pytest.approx(
        64 + 960 * SHARE + 0.8 * 960)
    assert _default().choose(KEYS, TIERS, candidates(loads)).id == "holder"
    assert _default(ghost_weight=0.0).choose(KEYS, TIERS, candidates(loads)).id == "idle"


@pytest.mark.parametrize("pulls", [None, PullPriors(False)])
def test_without_pulls_the_default_is_the_token_formula(pulls):
    """No pull planned: no pull priced and no copy's damage, whatever comes back (the holder 814, the idle
    replica 1024)."""
    loads = {"holder": _pulling(pending_prefill_tokens=5_000, comeback=0.8), "idle": _pulling(comeback=0.8)}
    policy = _default(pulls)
    assert policy.costs(KEYS, TIERS.device, candidates(loads), pullable=TIERS.pullable) == {
        "holder": pytest.approx(814.0), "idle": pytest.approx(1024.0)}
    assert policy.choose(KEYS, TIERS, candidates(loads)).id == "holder"


@pytest.mark.parametrize(("peer_pulls", "keeps"), [(True, True), (False, False)])
def test_the_router_keeps_ghosts_for_the_default_only_where_it_plans_pulls(peer_pulls, keeps):
    from kvmesh.router.routing.kv_placement import KVPlacementRules

    router = KVRouter(block_size=BS, policy=_default(None), transfers=KVPlacementRules(peer_pulls=peer_pulls))
    router.add_replica("a")
    router.apply_events("a", [stored(KEYS, BS, 0, 4), removed(KEYS, BS, [3]), stored(KEYS, BS, 3, 1)])
    assert (router.ghosts is not None) is keeps
    assert router.replicas.get("a").load.came_back_blocks == (1 if keeps else 0)
