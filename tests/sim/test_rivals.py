"""The rivals' routing formulas (``dynamo``, ``llmd``, ``llmd_precise``, ``sglang``; cluster/measure/sim/rivals/)
pinned on hand-computed cases; they run through the real router in the simulator and are no router policy."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.rivals import COMPARED
from kvmesh.cluster.measure.sim.rivals.llmd import LlmdConfig
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.policies import get_policy as _get_policy
from kvmesh.router.routing.tier_matches import TierMatches

BS = 16
KEYS = list(range(64))  # a 1,024-token prompt: 64 blocks


def get_policy(name, options=None, block_size=BS, seed=None):
    """A rival by name (the simulator's registry)."""
    return _get_policy(name, options, block_size, seed, registry=COMPARED)


def loads(n=2, **per_replica):
    out = {f"r{i}": ReplicaLoad() for i in range(n)}
    for rid, kw in per_replica.items():
        for k, v in kw.items():
            setattr(out[rid], k, v)
    return out


# -- dynamo: prefill blocks left (queued + prompt - cached) + active blocks with this request's, lowest wins --

def test_dynamo_cost_is_prefill_blocks_left_plus_active_blocks():
    policy = get_policy("dynamo", block_size=BS, seed=0)
    costs = policy.costs(KEYS, TierMatches({"r1": 40}), loads(2, r1={"pending_prefill_tokens": 16 * 39}))
    assert costs == {"r0": 64 + 64, "r1": (39 + 64 - 40) + 64}
    assert policy.choose_worker(KEYS, TierMatches({"r1": 40}), loads(2, r1={"pending_prefill_tokens": 16 * 39})) == "r1"
    fresh = get_policy("dynamo", block_size=BS, seed=0)
    assert fresh.choose_worker(KEYS, TierMatches({"r1": 40}), loads(2, r1={"pending_prefill_tokens": 16 * 41})) == "r0"


def test_dynamo_host_blocks_save_three_quarters_of_a_block():
    policy = get_policy("dynamo", block_size=BS, seed=0)
    costs = policy.costs(KEYS, TierMatches({"r0": 16}, {"r0": 48}), loads(2))
    assert costs["r0"] == (64 - 16 - 0.75 * 32) + 64


def test_dynamo_counts_active_blocks_until_the_request_finishes():
    policy = get_policy("dynamo", block_size=BS, seed=0)
    assert policy.choose_worker(KEYS, TierMatches({"r1": 40}), loads(2)) == "r1"
    other = list(range(100, 164))
    busy = loads(2, r1={"in_flight": 1})
    assert policy.costs(other, TierMatches(), busy) == {"r0": 128, "r1": 64 + 128}
    same = policy.costs(KEYS, TierMatches(), busy)  # its blocks are active there already: counted once
    assert same == {"r0": 128, "r1": 64 + 64}
    assert policy.costs(other, TierMatches(), loads(2)) == {"r0": 128, "r1": 128}  # finished: released


def test_dynamo_breaks_ties_at_random():
    policy = get_policy("dynamo", block_size=BS, seed=1)
    chosen = {policy.choose_worker([k], TierMatches(), loads(4)) for k in range(200, 240)}
    assert len(chosen) > 1


# -- llmd: 3 x own-history prefix share + 2 x min-max queue + 2 x (1 - KV usage), highest wins --

def test_llmd_default_profile_weights():
    policy = get_policy("llmd", block_size=BS, seed=0)
    blocks = policy.blocks(KEYS, 1024)  # 16 blocks of 64 tokens
    policy.history.add("r1", blocks[:8], 1000)
    scraped = loads(3, r0={"num_waiting": 0, "kv_usage": 0.4}, r1={"num_waiting": 4, "kv_usage": 0.25},
                    r2={"num_waiting": 2, "kv_usage": 0.1})
    assert policy.scores(blocks, scraped) == pytest.approx(
        {"r0": 3 * 0 + 2 * 1.0 + 2 * 0.6, "r1": 3 * 0.5 + 2 * 0.0 + 2 * 0.75, "r2": 3 * 0 + 2 * 0.5 + 2 * 0.9})
    assert policy.choose_worker(KEYS, TierMatches(), scraped, 1024) == "r0"


def test_llmd_blocks_are_64_tokens_whatever_the_engine_block_and_the_tail_counts():
    policy = get_policy("llmd", block_size=BS, seed=0)
    assert policy.block_size_tokens == 64 and policy.max_blocks == 131_072 // 64
    assert policy.blocks(KEYS, 1024) == KEYS[3::4]  # every fourth key chains a whole 64-token prefix
    blocks = policy.blocks(KEYS[:10], 170)  # 2 whole blocks (128 tokens), then 42 tokens
    assert blocks[:2] == [3, 7] and blocks[2] == ("tail", 9, 170)
    assert get_policy("llmd", block_size=128).blocks(KEYS[:3], 3 * 128) == KEYS[:3]  # a coarser engine block
    assert policy.blocks([], 12) == []  # shorter than an engine block: nothing to tell two such prompts apart by


def test_llmd_prefix_is_its_own_routing_history_not_the_index():
    policy = get_policy("llmd", block_size=BS, seed=0)
    first = policy.choose_worker(KEYS, TierMatches({"r1": 64}), loads(2), 1024)
    assert policy.scores(policy.blocks(KEYS, 1024), loads(2))[first] == 3 + 2 + 2
    assert policy.choose_worker(KEYS, TierMatches({"r1": 64}), loads(2), 1024) == first


def test_llmd_counts_what_each_server_was_sent_until_a_block_nobody_was():
    policy = get_policy("llmd", block_size=BS, seed=0)
    history = policy.history
    history.add("r0", ["a", "c"], 100)
    history.add("r1", ["a", "b"], 100)
    assert history.matches(["a", "b", "c", "d"]) == {"r0": 2, "r1": 2}  # r0 lacks "b" and still counts "c"
    assert history.matches(["x", "a"]) == {}


def test_llmd_lru_is_sized_by_the_servers_reported_cache_when_first_routed():
    policy = get_policy("llmd", block_size=BS, seed=0)
    small = loads(1, r0={"num_kv_blocks": 10})
    policy.choose_worker(KEYS, TierMatches(), small, 1024)  # 16 blocks into an LRU of 10: the first 6 go
    assert len(policy.history.servers["r0"]) == 10
    assert policy.history.matches(policy.blocks(KEYS, 1024)) == {}  # its leading blocks were evicted
    fixed = get_policy("llmd", LlmdConfig(auto_tune=False, lru_capacity_blocks=12, block_size_tokens=128),
                       block_size=BS, seed=0)
    fixed.choose_worker(KEYS, TierMatches(), small, 1024)
    assert fixed.block_size_tokens == 128 and len(fixed.history.servers["r0"]) == 8  # 8 blocks of 128 fit in 12


# -- llmd_precise: 2 x tier-weighted longest prefix over the request's blocks + 1 x queue + 1 x KV --

def test_llmd_precise_scores_the_weighted_match_over_the_requests_blocks():
    policy = get_policy("llmd_precise", block_size=BS, seed=0)
    tiers = TierMatches({"r0": 10, "r1": 20}, {"r2": 31})  # r2: 31 host blocks = 24.8 weighted, 24 whole
    scores = policy.scores(64, tiers, loads(4))
    assert scores == pytest.approx({"r0": 2 * 10 / 64 + 2, "r1": 2 * 20 / 64 + 2, "r2": 2 * 24 / 64 + 2, "r3": 2})
    assert policy.choose_worker(KEYS, tiers, loads(4)) == "r2"


def test_llmd_precise_a_short_match_does_not_outweigh_a_queue():
    policy = get_policy("llmd_precise", block_size=BS, seed=0)
    scraped = loads(2, r0={"num_waiting": 3, "kv_usage": 0.9})
    assert policy.scores(64, TierMatches({"r0": 1}), scraped) == pytest.approx({"r0": 2 / 64 + 0 + 0.1, "r1": 2})
    assert policy.choose_worker(KEYS, TierMatches({"r0": 1}), scraped) == "r1"  # one block of 64: the idle one
    assert policy.choose_worker(KEYS, TierMatches({"r0": 64}), scraped) == "r0"  # the whole prompt: its holder
    assert policy.scores(0, TierMatches({"r0": 1}), scraped) == pytest.approx({"r0": 0.1, "r1": 2})


# -- sglang: shortest queue when imbalanced, else the tree's match above 0.3, else the smallest tree --

def test_sglang_imbalance_needs_both_thresholds():
    policy = get_policy("sglang", block_size=BS, seed=0)
    assert policy.imbalanced(loads(2, r0={"in_flight": 100}, r1={"in_flight": 30}))  # 70 > 64, 100 > 45
    assert not policy.imbalanced(loads(2, r0={"in_flight": 100}, r1={"in_flight": 40}))  # 60 <= 64
    assert not policy.imbalanced(loads(2, r0={"in_flight": 200}, r1={"in_flight": 135}))  # 200 <= 202.5
    policy.tree.insert(KEYS, "r0")
    assert policy.choose_worker(KEYS, TierMatches(), loads(2, r0={"in_flight": 100}, r1={"in_flight": 30})) == "r1"


def test_sglang_cache_threshold_and_smallest_tree():
    policy = get_policy("sglang", block_size=BS, seed=0)
    policy.tree.insert(KEYS, "r0")
    above = KEYS[:20] + list(range(1000, 1044))  # 20 / 64 = 0.3125 > 0.3
    below = KEYS[:19] + list(range(2000, 2045))  # 19 / 64 = 0.297
    assert policy.choose_worker(above, TierMatches({"r1": 64}), loads(2)) == "r0"
    assert policy.choose_worker(below, TierMatches(), loads(2)) == "r1"  # r1's tree is empty: the smallest
    assert (policy.tree.size("r0"), policy.tree.size("r1")) == (64 + 44, 64)


def test_sglang_tree_evicts_the_least_recently_routed_past_its_size():
    from kvmesh.cluster.measure.sim.rivals.sglang import SglangConfig

    policy = get_policy("sglang", SglangConfig(max_tree_size_tokens=80 * BS), block_size=BS, seed=0)
    policy.tree.insert(KEYS, "r0")
    policy.tree.insert(list(range(500, 532)), "r0")  # 96 keys > 80: the 16 oldest go
    assert policy.tree.size("r0") == 80
    assert policy.tree.prefix_match(KEYS) == (0, None)
    assert policy.tree.prefix_match(KEYS[16:]) == (48, "r0")


@pytest.mark.parametrize("name", ["dynamo", "llmd", "llmd_precise", "sglang"])
def test_a_rival_runs_through_the_real_router(name):
    from kvmesh.router.routing.kv_router import KVRouter

    r = KVRouter(block_size=BS, policy=get_policy(name, block_size=BS, seed=0), predict_ttl_s=0)
    for rid in ("r0", "r1", "r2"):
        r.add_replica(rid)
    tokens = [3 + i % 250 for i in range(8 * BS)] + [1]
    first = r.route(tokens, now=0.0)
    assert first.replica_id in {"r0", "r1", "r2"}
    assert r.route(tokens, now=1.0).replica_id in {"r0", "r1", "r2"}


@pytest.mark.parametrize("name", ["dynamo", "llmd", "llmd_precise", "sglang"])
def test_naming_a_rival_as_the_router_policy_says_it_runs_in_the_simulator(name):
    from kvmesh.router.config import RouterConfig

    with pytest.raises(ValueError, match=f"policy {name!r} is another system's routing formula.*kvmesh sim"):
        RouterConfig(policy=name)
    with pytest.raises(ValueError, match="not a router policy"):
        _get_policy(name, block_size=BS)


def test_the_routers_list_of_rival_names_is_the_simulators_registry():
    from kvmesh.cluster.measure.sim.rivals import RIVALS
    from kvmesh.router.routing.policies import POLICIES, RIVAL_NAMES

    assert set(RIVALS) == RIVAL_NAMES
    assert not RIVAL_NAMES & set(POLICIES)
