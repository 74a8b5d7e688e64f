"""``--routers N``: independent routers, each with its own index, predictions and load view."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kvmesh.cluster.measure.sim.config import SimConfig, sim_engine
from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.sim.router import SimRouter
from kvmesh.cluster.measure.sim.run import compare_policies, run_policy
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.generated import SyntheticTrace
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord
from kvmesh.kvcache.hashing import external_hash

CFG = SimConfig(num_replicas=4, engine=sim_engine(block_size=32, max_num_batched_tokens=256), blocks_per_replica=16)


def _trace(n: int = 80) -> list[MooncakeRecord]:
    recs = []
    for i in range(n):  # 8 prefixes of 3 blocks, each request adds its own block
        ids = tuple(100 * (i % 8) + k for k in range(3)) + (10_000 + i,)
        recs.append(MooncakeRecord(i * 30.0, len(ids) * 32 - 5, 4, ids))
    return recs


def _run(config: SimConfig, policy: str = "cache_aware"):
    reqs = requests_from_mooncake(_trace(), 1.0, 32, trace_block_tokens=32)
    return run_policy(policy, reqs, config, 16, BlockTokenCache(32, 256))


def test_requests_are_spread_round_robin_and_every_router_indexes_every_replica():
    run = _run(replace(CFG, num_routers=3))
    assert [r.router_index for r in run.requests[:6]] == [0, 1, 2, 0, 1, 2]
    assert len(run.router.routers) == 3
    for router in run.router.routers:
        for rep in run.replicas:
            pool = {external_hash(h) for h in rep.kv.block_pool.cached_block_hash_to_block}
            assert router.index.cached_hashes(rep.replica_id) == pool
            assert router.loads.loads[rep.replica_id].in_flight == 0  # every request was accounted back


def test_random_spread_is_seeded_and_uses_every_router():
    a = [r.router_index for r in _run(replace(CFG, num_routers=3, router_spread="random")).requests]
    b = [r.router_index for r in _run(replace(CFG, num_routers=3, router_spread="random")).requests]
    assert a == b and set(a) == {0, 1, 2}


def test_load_polls_give_every_router_the_replicas_reports():
    run = _run(replace(CFG, num_routers=2, load_poll_s=0.5))
    for router in run.router.routers:
        assert all(load.reported_at is not None for load in router.loads.loads.values())


def test_shared_predictions_credit_the_replica_in_the_other_routers():
    cfg = replace(CFG, num_routers=2, share_predictions=True)
    reqs = requests_from_mooncake(_trace(2), 1.0, 32, trace_block_tokens=32)
    tokens = BlockTokenCache(32, 256)
    for share in (False, True):
        sim = SimRouter("cache_aware", replace(cfg, share_predictions=share), [_Rep(i) for i in range(4)])
        reqs[0].all_token_ids = tokens.prompt(reqs[0].hash_ids, reqs[0].num_prompt_tokens)
        rid = sim.route(reqs[0])
        other = sim.routers[1].index.match(sim.routers[0].hasher.keys(reqs[0].all_token_ids), now=0.0)
        assert other == ({rid: 3} if share else {})


class _Rep:
    def __init__(self, index: int) -> None:
        self.replica_id = str(index)
        self.role = "both"
        self.num_blocks = 64  # its cache, as the router is told


def test_sessions_help_one_router_and_need_a_shared_table_under_several():
    recs = SyntheticTrace(num_requests=120, conversations_per_s=2.0, think_s=2.0, system_blocks=2,
                          turn_blocks=1).records()
    hits = {}
    for n in (1, 4):
        # pins that bind: the cost in seconds keeps a conversation where it is cached by itself; a pin that gives
        # way at 0.05-1 s of predicted time only cost hits here
        cfg = replace(CFG, num_routers=n, policy_kwargs={"session_slack_s": 3.0})
        report = compare_policies(recs, miniature_cfg(cfg), ["cache_aware"],
                                  show_progress=False, variants={
                                      "/off": {"use_sessions": False}, "/on": {"use_sessions": True},
                                      "/shared": {"use_sessions": True, "share_sessions": True}})
        for label, s in report["policies"].items():
            hits[n, label.split("/")[1]] = s["hit_rate"]
            assert (s["receipts"]["reasons"]["session"] > 0) == (not label.endswith("off"))
    assert hits[1, "on"] >= hits[1, "off"]
    # Each router pins only the turns it routed: its pins go stale unless the routers share them.
    assert hits[4, "shared"] > hits[4, "on"]


def miniature_cfg(config: SimConfig) -> SimConfig:
    from kvmesh.cluster.measure.sim.config import miniature

    full = replace(config, engine=replace(config.engine, block_size=512), blocks_per_replica=None,
                   capacity_fraction=0.5)
    return miniature(full, 16)


def test_gap_attribution_adds_up_to_the_gap_to_the_single_pool():
    # In the trace's own 512-token units (compare_policies maps one hash id to one 32-token block).
    recs = [replace(r, timestamp_ms=r.timestamp_ms / 4, input_length=len(r.hash_ids) * 512 - 5) for r in _trace()]
    report = compare_policies(recs, replace(CFG, blocks_per_replica=None), ["cache_aware", "random"],
                              show_progress=False)
    pool = report["ceilings"]["single_pool_hit_rate"]
    for s in report["policies"].values():
        g = s["gap_to_single_pool"]
        assert abs(g["gap_points"] - 100 * (pool - s["hit_rate"])) < 1e-6
        parts = (g["evicted_everywhere_points"] - g["kept_beyond_pool_points"] + g["diverted_points"]
                 + g["routing_admission_race_lost_points"] - g["routing_admission_race_gained_points"])
        assert abs(parts - g["gap_points"]) < 1e-6
    assert report["policies"]["random"]["gap_to_single_pool"]["diverted_points"] > 0


def test_shared_loads_count_every_routers_dispatches_in_each_router():
    reqs = requests_from_mooncake(_trace(1), 1.0, 32, trace_block_tokens=32)
    reqs[0].all_token_ids = BlockTokenCache(32, 256).prompt(reqs[0].hash_ids, reqs[0].num_prompt_tokens)
    for share in (False, True):
        sim = SimRouter("cache_aware", replace(CFG, num_routers=2, share_loads=share), [_Rep(i) for i in range(4)])
        rid = sim.route(reqs[0])
        assert sim.routers[1].loads.loads[rid].in_flight == (1 if share else 0)
        sim.on_first_tokens(rid, [reqs[0]])
        sim.on_finished(rid, [reqs[0]])
        assert all(r.loads.loads[rid].in_flight == 0 for r in sim.routers)


def _views(sim_run, rid: str) -> set[tuple[int, int, int]]:
    """Each router's (published seq, decode load, prefill backlog) of replica ``rid``."""
    return {(r.loads.loads[rid].published_seq, r.loads.loads[rid].decode_load, r.loads.loads[rid].prefill_backlog)
            for r in sim_run.router.routers}


def test_published_loads_give_every_router_the_same_view_and_book_only_their_own_requests():
    from kvmesh.cluster.measure.sim import loop

    seen: list[set] = []
    original = loop.Simulation.dispatch

    def dispatch(self, req, now, router=None):  # every router's view of every replica, just before each decision
        seen.extend(_views(self, rep.replica_id) for rep in self.replicas)
        original(self, req, now, router)

    reqs = requests_from_mooncake(_trace(), 0.01, 32, trace_block_tokens=32)  # 100x the rate: queues form
    config = replace(CFG, num_routers=3, published_loads=True, load_publish_lag_s=0.0, load_publish_interval_s=0.0)
    loop.Simulation.dispatch = dispatch
    try:
        run = run_policy("cache_aware", reqs, config, 16, BlockTokenCache(32, 256))
    finally:
        loop.Simulation.dispatch = original
    # booked from the replicas' first update on (the first request comes before it), each by its own router
    assert run.requests[0].booking is None
    assert all(r.booking is not None and r.booking[0] == run.router.routers[r.router_index].loads.router_id
               for r in run.requests[1:])
    assert any(len({(seq, load) for seq, load, _ in views}) == 1 and max(load for _, load, _ in views) > 1
               for views in seen)  # a queue every router sees alike
    # with no lag, routers differ only by their own bookings the replica did not count yet: none here
    assert all(len({seq for seq, _, _ in views}) == 1 for views in seen)
    for router in run.router.routers:
        for rep in run.replicas:
            assert router.loads.loads[rep.replica_id].unacked_requests == 0


def test_a_replica_publishes_a_request_it_accepted_at_once_and_a_steps_change_once_per_interval():
    from kvmesh.cluster.measure.sim.published import SimLoadPublishing

    publishing = SimLoadPublishing()
    assert publishing.wait("0", 0.0, 0.005, due=False) == 0.0  # the first change: now
    assert publishing.wait("0", 0.001, 0.005, due=False) == pytest.approx(0.004)  # a step's: when the interval ends
    assert publishing.wait("0", 0.002, 0.005, due=False) is None  # already due then
    assert publishing.wait("0", 0.003, 0.005, due=False, accepted=True) == 0.0  # a request accepted: now
    assert publishing.wait("0", 0.005, 0.005, due=True) == 0.0  # the step's change: when its interval ended


def test_shared_and_published_loads_together_are_refused_as_they_would_count_twice():
    with pytest.raises(ValueError, match="count another router's request twice"):
        replace(CFG, num_routers=2, share_loads=True, published_loads=True)


def test_synced_routers_count_each_others_bookings_and_blocks_once_the_lag_passed():
    """``router_sync`` (router/control/router_sync.py's stream): ``sync_lag_s`` after a router's choice the others
    count its booking on that replica (until the replica's published load acknowledges it) and predict its blocks
    there; inside the lag they decide blind of it."""
    from kvmesh.events.publish.load_ledger import LoadLedger

    config = replace(CFG, num_routers=2, published_loads=True, router_sync=True, sync_lag_s=0.001)
    sim = SimRouter("cache_aware", config, [_Rep(i) for i in range(4)])
    for rep in range(4):  # every replica has published its (empty) load: bookings are counted
        sim.apply_load(str(rep), LoadLedger().update(0.0, 0.0, 0, 0, 0, 0.0), 0.0)
    reqs = requests_from_mooncake(_trace(3), 1.0, 32, trace_block_tokens=32)
    tokens = BlockTokenCache(32, 256)
    for req, at in zip(reqs, (0.0, 0.0005, 0.002), strict=True):
        req.all_token_ids = tokens.prompt(req.hash_ids, req.num_prompt_tokens)
        req.arrival_s = at
    rid = sim.route(reqs[0])  # router 0
    keys = sim.routers[0].hasher.keys(reqs[0].all_token_ids)
    other = sim.routers[1]
    sim.route(reqs[1])  # router 1, inside the lag: blind of router 0's choice
    assert other.loads.loads[rid].peer_bookings == {} and other.index.match(keys, now=0.0005).get(rid, 0) == 0
    sim.route(reqs[2])  # router 0 again, after the lag: router 1 has taken the first choice
    load = other.loads.loads[rid]
    assert load.peer_bookings[reqs[0].booking[0]].unacked_tokens == reqs[0].num_prompt_tokens
    assert other.index.match(keys, now=0.002)[rid] == len(keys)


def test_synced_routers_need_the_published_load_that_acknowledges_their_bookings():
    with pytest.raises(ValueError, match="published_loads"):
        replace(CFG, num_routers=2, router_sync=True)


def _bursts(n: int = 4) -> list[MooncakeRecord]:
    """Four bursts 2 s apart, each of four requests at one instant sharing a new 6-block prefix."""
    return [MooncakeRecord(t * 2000.0, 7 * 32 - 5, 4, tuple(1000 * t + k for k in range(6)) + (10_000 + 10 * t + i,))
            for t in range(n) for i in range(4)]


def _taking_turns(turn: float, monkeypatch) -> tuple[list, list[int]]:
    """The requests of ``_bursts`` through four synced routers, and how many requests router 3 saw on the replicas
    when it decided each burst's request (running, waiting, and not yet acknowledged: the others' told it)."""
    from kvmesh.router.routing.policies import DEFAULT_POLICY

    seen: list[int] = []

    def route(self, req, k=None):
        if (k if k is not None else self._next % len(self.routers)) == 3:
            self._land_synced(req.routed_s)
            loads = self.routers[3].loads.loads.values()
            seen.append(sum(load.num_running + load.num_waiting + load.unacked_requests for load in loads))
        return _ROUTE(self, req, k)

    monkeypatch.setattr(SimRouter, "route", route)
    config = replace(CFG, blocks_per_replica=64, num_routers=4, published_loads=True, router_sync=True,
                     sync_lag_s=0.001, router_turn_s=turn)
    reqs = requests_from_mooncake(_bursts(), 1.0, 32, trace_block_tokens=32)
    return run_policy(DEFAULT_POLICY, reqs, config, 64, BlockTokenCache(32, 256)).requests, seen


_ROUTE = SimRouter.route


def test_taking_turns_routers_decide_one_after_another_each_told_the_earlier_ones_choices(monkeypatch):
    """``router_stagger_s``: router k decides k x stagger after the arrival, so in a burst router 3 has been told
    routers 0-2's requests before it decides (blind of them at once); the wait counts in TTFT."""
    requests, seen = _taking_turns(0.002, monkeypatch)
    for r in requests:
        assert r.routed_s - r.arrival_s == pytest.approx(0.002 * r.router_index)
        assert r.first_token_s - r.arrival_s > 0.002 * r.router_index
    assert seen == [3, 3, 3, 3]
    alone = run_policy("cache_aware", requests_from_mooncake(_bursts(), 1.0, 32, trace_block_tokens=32),
                       replace(CFG, blocks_per_replica=64, published_loads=True, router_sync=True, router_turn_s=0.002),
                       64, BlockTokenCache(32, 256)).requests
    assert all(r.routed_s == r.arrival_s for r in alone)  # a router alone waits for no one
    blind, seen_blind = _taking_turns(0.0, monkeypatch)
    assert all(r.routed_s == r.arrival_s for r in blind)
    assert seen_blind == [0, 0, 0, 0]


@pytest.mark.parametrize("bad", [{"router_turn_s": -0.001, "router_sync": True, "published_loads": True},
                                 {"router_turn_s": 0.002},
                                 {"router_turn_s": 0.001, "router_sync": True, "published_loads": True}])
def test_turns_need_the_sync_stream_and_to_be_longer_than_its_lag(bad):
    with pytest.raises(ValueError, match="router_turn_s"):
        replace(CFG, num_routers=2, **bad)


def test_synced_routers_hold_each_others_predictions_until_the_first_token():
    """With ``predict_hold_s`` (router/routing/peer_holds.py) a choice that reached the other router holds there past
    ``predict_ttl_s`` until the request's first token, then lasts the TTL, as over the live sync stream."""
    from kvmesh.events.publish.load_ledger import LoadLedger

    router = replace(CFG.router, predict_ttl_s=0.01, predict_hold_s=30.0)
    sim = SimRouter("cache_aware", replace(CFG, num_routers=2, published_loads=True, router_sync=True,
                                           sync_lag_s=0.001, router=router), [_Rep(i) for i in range(4)])
    for rep in range(4):
        sim.apply_load(str(rep), LoadLedger().update(0.0, 0.0, 0, 0, 0, 0.0), 0.0)
    reqs = requests_from_mooncake(_trace(2), 1.0, 32, trace_block_tokens=32)
    tokens = BlockTokenCache(32, 256)
    for req, at in zip(reqs, (0.0, 0.002), strict=True):
        req.all_token_ids = tokens.prompt(req.hash_ids, req.num_prompt_tokens)
        req.arrival_s = at
    rid = sim.route(reqs[0])
    sim.route(reqs[1])  # router 1, after the lag: it has taken router 0's choice
    keys, other = sim.routers[0].hasher.keys(reqs[0].all_token_ids), sim.routers[1]
    assert other.index.match(keys, now=1.0)[rid] == len(keys)  # 100 TTLs later: held
    reqs[0].first_token_s = 1.5
    sim.on_first_tokens(rid, [reqs[0]])
    assert other.index.match(keys, now=1.505)[rid] == len(keys)  # the TTL from the news (first token + lag)
    assert other.index.match(keys, now=1.6).get(rid, 0) == 0
