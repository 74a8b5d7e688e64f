"""The router prices many candidates in one vectorised pass over its loads kept as columns
(router/routing/cost/load_columns.py: the price's terms evaluated on arrays, router/routing/cost/columns_price.py):
its decisions equal those made from a plain dict of loads priced one by one, on randomized fleets (rates measured or
not, decode fits, corrections, arrivals, host tiers, pulls, adapters, identical replicas that tie), and the columns
follow every change of a load, however it is made. The terms themselves are checked against hand-computed cases in
test_price_terms.py."""

from __future__ import annotations

import random

import numpy as np
import pytest
from kvmesh.replica.serving.load_report import DecodeStepLoad, LoadReport, LoRALoad
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing import routable
from kvmesh.router.routing.cost import FleetRates, PullPriors
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import plain

BS = 4


@pytest.fixture(autouse=True)
def columns_at_any_size(monkeypatch):
    """Every fleet here is priced from the columns, however small (``KVRouter`` prices small ones one by one)."""
    monkeypatch.setattr(routable, "COLUMNS_FROM", 1)


def _maybe(rng: random.Random, value, p: float = 0.5):
    return value if rng.random() < p else None


def randomize(load: ReplicaLoad, rng: random.Random) -> None:
    """Every field the cost reads, drawn at random (about half of the rates not measured)."""
    load.in_flight, load.num_running, load.num_waiting = rng.randrange(4), rng.randrange(5), rng.randrange(3)
    load.pending_prefill_tokens, load.queued_prefill_tokens = rng.choice((0, 0, 37, 900)), rng.choice((0, 64, 5000))
    load.prefill_tokens_per_s = _maybe(rng, rng.choice((1000.0, 4096.0, 30000.0, 0.0)))
    load.kv_block_bytes = _maybe(rng, rng.choice((4096, 65536)))
    load.kv_bytes_per_token = _maybe(rng, 512)
    load.h2d_bytes_per_s = _maybe(rng, rng.choice((1e9, 5e9)))
    load.kv_transfer_enabled = rng.random() < 0.5
    load.pull_bytes_per_s = _maybe(rng, rng.choice((1e8, 2e9)))
    load.pull_fixed_s = _maybe(rng, rng.choice((0.0, 0.003)))
    step = rng.random()
    load.decode_step = None if step < 0.3 else DecodeStepLoad(
        step_s=_maybe(rng, rng.choice((0.004, 0.01)), 0.8), s_per_seq=_maybe(rng, 1e-4),
        s_per_context_token=_maybe(rng, 1e-7), context_tokens=rng.choice((0, 0, 3000)))
    load.lora = _maybe(rng, LoRALoad(enabled=True, adapters={"a": 10_000_000, "b": 0}, resident=rng.choice(([], ["a"])),
                                     load_bytes_per_s=_maybe(rng, 1e9)), 0.3)
    load.ttft_correction, load.ttft_offset_s = rng.choice((1.0, 0.5, 2.3)), rng.choice((0.0, 0.0, 0.02))
    load.recent_prompt = rng.choice((0.0, 1000.0, 7777.7))
    load.recent_prefill = load.recent_prompt * rng.choice((0.0, 0.1, 0.5, 1.0))
    load.recent_requests = rng.choice((0.0, 1.0, 3.5)) if load.recent_prompt else 0.0
    load.arrival_rate = rng.choice((0.0, 0.0, 0.03, 1.7))
    load.peer_in_flight = rng.choice((0, 0, 2))


def copy_load(dst: ReplicaLoad, src: ReplicaLoad) -> None:
    for name in ReplicaLoad.__dataclass_fields__:
        if name != "watcher":
            setattr(dst, name, getattr(src, name))


def random_router(rng: random.Random) -> tuple[KVRouter, list[int]]:
    """A router over 1..40 replicas with random loads; some replicas copy another's load (they tie)."""
    router = KVRouter(block_size=BS)
    ids = rng.sample(range(100), rng.randint(1, 40))
    for rid in ids:
        router.add_replica(rid, healthy=rng.random() < 0.9, role=rng.choice(("both", "both", "both", "prefill")))
    loads = router.loads.loads
    for rid in ids:
        randomize(loads[rid], rng)
    for rid in rng.sample(ids, len(ids) // 3):
        copy_load(loads[rid], loads[rng.choice(ids)])
    return router, ids


def random_tiers(rng: random.Random, ids: list[int], num_blocks: int) -> TierMatches:
    device = {rid: rng.randint(1, num_blocks + 2) for rid in rng.sample(ids, rng.randint(0, len(ids)))}
    host = {rid: rng.randint(1, num_blocks + 2) for rid in rng.sample(ids, rng.randint(0, len(ids) // 2))}
    return TierMatches(device, host if rng.random() < 0.5 else {})


def test_columns_fleet_rates_equal_fleet_rates_of_the_candidates():
    for seed in range(100):
        rng = random.Random(seed)
        router, ids = random_router(rng)
        with router.lock:
            loads = router.candidates(set(rng.sample(ids, rng.randint(0, min(3, len(ids)))))).loads
        assert loads.fleet() == FleetRates.of(dict(loads).values()), seed


@pytest.mark.parametrize("temperature", [0.0, 0.01])
def test_pruned_decisions_equal_the_full_scan_on_random_fleets(temperature):
    """The same requests through two policies (same seed): one gets the columns, the other a plain dict."""
    for seed in range(150):
        rng = random.Random(seed)
        router, ids = random_router(rng)
        config = CacheAwareConfig(temperature=temperature, decode_step_tokens=rng.choice((8192, 48)))
        fast, full = CacheAwarePolicy(config, BS, seed), CacheAwarePolicy(config, BS, seed)
        pulls = rng.choice((None, PullPriors(True, 1e9, 0.002)))
        fast.use_pulls(pulls)
        full.use_pulls(pulls)
        for _ in range(6):
            prompt = rng.choice((5, 64, 600))
            tiers = random_tiers(rng, ids, prompt // BS) if rng.random() < 0.7 else TierMatches()
            lora = rng.choice((None, None, "a"))
            with router.lock:
                among = router.candidates(set())
            if not among:
                break
            keys = list(range(prompt // BS))
            fast_choice, full_choice = fast.decide(keys, tiers, among, prompt, lora), full.decide(
                keys, tiers, plain(among), prompt, lora)
            chosen = fast_choice.replica
            assert chosen is full_choice.replica, seed
            assert fast_choice.estimate == full_choice.estimate, seed
            pinned = rng.choice(list(among))
            assert (fast.keeps_session(pinned, fast_choice, keys, tiers, among, prompt)
                    == full.keeps_session(pinned, full_choice, keys, tiers, plain(among), prompt)), seed
            router.loads.on_dispatch(chosen, prompt, now=float(_),
                                     prompt_tokens=prompt)  # the columns follow


def test_route_through_the_router_equals_the_full_scan(monkeypatch):
    """``KVRouter.route`` end to end, loads changing between requests (dispatches, first tokens, reports, a replica
    leaving and joining, health): the same decisions as a router handing the policy a plain dict."""
    rng = random.Random(7)
    routers = []
    for _ in range(2):
        router = KVRouter(block_size=BS, policy=CacheAwarePolicy(CacheAwareConfig(), BS, 1))
        for rid in range(30):
            router.add_replica(rid)
        routers.append(router)
    fast, full = routers
    monkeypatch.setattr(full, "candidates", lambda excluded, pool=None: plain(
        KVRouter.candidates(full, excluded, pool)))
    for rid in range(30):
        for router in routers:
            randomize(router.loads.loads[rid], random.Random(rid))
    prompts = [[rng.randrange(50) for _ in range(rng.choice((8, 40, 90)))] for _ in range(12)]
    for step in range(300):
        tokens = rng.choice(prompts) + [rng.randrange(50) for _ in range(rng.randrange(6))]
        action = rng.random()
        exclude = {rng.randrange(30)} if rng.random() < 0.1 else set()
        decisions = [r.route(tokens, exclude=exclude, now=float(step)) for r in routers]
        assert decisions[0].replica_id == decisions[1].replica_id, step
        assert decisions[0].predicted_ttft_s == decisions[1].predicted_ttft_s, step
        rid = decisions[0].replica_id
        for router in routers:
            replica = router.replicas.get(rid)
            router.loads.on_dispatch(replica, decisions[0].uncached_tokens, now=float(step), prompt_tokens=len(tokens))
            if action < 0.3:
                router.loads.on_first_output(replica, decisions[0].uncached_tokens)
            elif action < 0.4:
                router.loads.loads[rid].update_report(LoadReport(
                    num_requests_running=3, num_requests_waiting=1, kv_cache_usage=0.5, num_waiting_prefill_tokens=99,
                    prefill_tokens_per_s=2000.0 + step))
            elif action < 0.45:
                router.set_healthy(router.replicas.get(rid), False)
            elif action < 0.5:
                router.set_healthy(router.replicas.get((rid + 1) % 30), True)
            elif action < 0.52:
                router.remove_replica(rid)
                router.add_replica(rid)


def test_a_load_set_in_place_moves_the_next_decision():
    """Hostile: a field written straight onto a ``ReplicaLoad`` (no tracker call) still reaches the columns."""
    router = KVRouter(block_size=BS)
    for rid in ("a", "b"):
        router.add_replica(rid)
        router.loads.loads[rid].prefill_tokens_per_s = 1000.0
    router.loads.loads["a"].queued_prefill_tokens = 1_000_000
    assert router.route(list(range(100, 132)), now=0.0).replica_id == "b"
    router.loads.loads["a"].queued_prefill_tokens = 0
    router.loads.loads["b"].queued_prefill_tokens = 1_000_000
    assert router.route(list(range(200, 232)), now=0.0).replica_id == "a"


def test_candidates_keep_the_trackers_order_after_a_replica_rejoins():
    router = KVRouter(block_size=BS)
    for rid in ("a", "b", "c"):
        router.add_replica(rid)
    router.remove_replica("a")
    router.add_replica("a")
    router.set_healthy(router.replicas.get("b"), False)
    with router.lock:
        among = router.candidates(set())
        assert [r.id for r in among] == ["c", "a"] == [r for r in router.loads.loads if r in router.healthy]
        assert list(among.loads) == ["c", "a"]
        assert [r.id for r in router.candidates({"c"})] == ["a"]
        assert [r.id for r in router.candidates(set(), frozenset({"b", "c"}))] == ["c"]
    assert np.count_nonzero(among.loads.mask) == 2


def test_a_fleet_growing_past_the_columns_threshold_decides_as_the_full_scan(monkeypatch):
    """Under ``COLUMNS_FROM`` replicas the policy gets a plain dict (the columns only follow the replica set); a
    fleet that grows past it is priced from columns that saw every change made meanwhile."""
    monkeypatch.setattr(routable, "COLUMNS_FROM", 6)
    fast = KVRouter(block_size=BS, policy=CacheAwarePolicy(CacheAwareConfig(), BS, 1))
    full = KVRouter(block_size=BS, policy=CacheAwarePolicy(CacheAwareConfig(), BS, 1))
    monkeypatch.setattr(full, "candidates", lambda excluded, pool=None: plain(
        KVRouter.candidates(full, excluded, pool)))
    rng = random.Random(3)
    kinds = []
    for step in range(120):
        if step % 15 == 0:
            for router in (fast, full):
                router.add_replica(step // 15)
                randomize(router.loads.loads[step // 15], random.Random(step))
        tokens = [rng.randrange(20) for _ in range(rng.choice((8, 30)))]
        decisions = [r.route(tokens, now=float(step)) for r in (fast, full)]
        assert decisions[0].replica_id == decisions[1].replica_id, step
        assert decisions[0].predicted_ttft_s == decisions[1].predicted_ttft_s, step
        with fast.lock:
            kinds.append(isinstance(fast.candidates(set()).loads, CandidateLoads))
        queued = rng.randrange(2000)
        for router in (fast, full):
            router.loads.on_dispatch(router.replicas.get(decisions[0].replica_id), decisions[0].uncached_tokens,
                                     now=float(step), prompt_tokens=len(tokens))
            router.loads.loads[decisions[0].replica_id].queued_prefill_tokens = queued
    assert not kinds[0] and kinds[-1]
