"""The real router in front of the simulated replicas: a ``KVRouter`` (``RouterKeyHasher``,
``PrefixIndex`` with predictions, ``LoadTracker``, a policy from the registry), fed in-process (no
sockets) with the replicas' KV events and driven in simulated time.

Loads are what the HTTP router itself knows (its ``LoadTracker`` counters: requests in flight,
uncached prompt tokens not yet past prefill) plus, with ``load_poll_s > 0``, the replicas'
``/load`` reports as of the router's last poll.

Roles and moves (sim/transfer.py): the routers decide as the HTTP router does (router/routing/kv_placement.py):
prefill replicas join with their role and never decode; ``KVRouter.choose_split`` gives a request whose
uncached suffix on its decode replica is long enough a prefill leg on the prefill replica with room that
gives it the earliest first token, when the split is worth its seconds (``SimRequest.prefill_leg``;
``pd_prefill_pick=policy`` lets the policy pick among them instead), and a request kept whole gets the
decision's peer pull (``RouteDecision.pull`` -> ``SimRequest.pull_from``) when the replicas report KV transfer
on (``peer_pulls``). As the HTTP router, it decides the split before it counts the request on its decode
replica, and counts a split's decode side as the tokens its pull leaves.

With ``num_routers > 1`` there are N such routers, as ``kvmesh router --workers N`` runs them:
each applies every replica's events to its own index, keeps its own predictions, counters and
session pins, and sees only the requests spread to it (and the polled reports).
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.lora import ModelPools, report_lora
from kvmesh.cluster.measure.sim.measured import sim_load_rates
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.measure.sim.transfer import pick_prefill_replica, prefill_leg
from kvmesh.kvcache.reuse import reusable_tokens
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.kv_placement import SPLIT_NO_ROOM, SPLIT_SLOWER, tokens_left_after_split
from kvmesh.router.routing.load import LoadTracker
from kvmesh.router.routing.peer_holds import PeerHolds
from kvmesh.router.routing.policies import Policy
from kvmesh.router.routing.tier_matches import TierMatches

if TYPE_CHECKING:
    from kvmesh.events.load import ReplicaLoadUpdate
    from kvmesh.router.routing.kv_router import KVRouter, RouteDecision


def available_policies() -> list[str]:
    """What ``--policies`` may name: the router's policies and the rivals' formulas (sim/rivals/)."""
    from kvmesh.cluster.measure.sim.rivals import COMPARED

    return list(COMPARED)


def default_policies() -> list[str]:
    """What ``kvmesh sim`` runs without ``--policies``: the router's policies (the rivals run when named)."""
    from kvmesh.router.routing.policies import POLICIES

    return list(POLICIES)


def build_policy(name: str, config: SimConfig, seed: int) -> Policy:
    """Policy ``name`` (the router's or a rival's) with the knobs of ``config.policy_kwargs`` it takes and the
    replicas' step budget."""
    from kvmesh.cluster.measure.sim.rivals import COMPARED
    from kvmesh.router.routing.policies import get_policy, policy_config, with_step_budget

    options = with_step_budget(name, config.policy_kwargs, config.engine.max_num_batched_tokens)
    return get_policy(name, policy_config(name, options, drop_unknown=True, registry=COMPARED),
                      config.engine.block_size, seed, registry=COMPARED)


class SimRouter:
    """``num_routers`` real ``KVRouter``s driven in simulated time, plus the dispatch/first-token/
    finish load accounting and the receipts the HTTP front keeps around each of them."""

    def __init__(self, policy: str, config: SimConfig, replicas: list[SimReplica]) -> None:
        from kvmesh.router.config import build_router
        from kvmesh.router.routing.keys import DEFAULT_ROUTER_SEED
        from kvmesh.router.routing.receipts import Receipts

        self.block_size = config.engine.block_size
        self.config = config
        section = replace(config.router, policy_kwargs={})  # the policy is built here (a rival is no router's)
        self.routers = [build_router(section, DEFAULT_ROUTER_SEED, build_policy(policy, config, config.seed + k))
                        for k in range(config.num_routers)]
        self.prefill_ids: list[str] = []
        """Replicas of role prefill (in the routers, never a decode candidate)."""
        for rep in replicas:
            self.add_replica(rep.replica_id, rep.num_blocks + 1, rep.role)
        self.router = self.routers[0]
        self.index = self.router.index
        self.tracker = self.router.loads
        self.policy_name = policy
        self.receipts = Receipts(block_size=self.block_size)
        """Every request's receipt, completed with the cached tokens its replica found on admission (its live
        ceiling's pool: the blocks the loop gives it, ``Simulation``)."""
        self._spread = random.Random(config.seed) if config.router_spread == "random" else None
        self.pools = ModelPools([], [])
        """Which base model each replica serves (sim/lora.py; set by the loop when the workload has several)."""
        self._next = 0
        # -- measured --
        self.num_events = 0
        self.apply_s = 0.0
        self.splits_skipped_no_room = 0
        """Requests long enough to split that stayed whole: no prefill replica had room."""
        self.splits_skipped_slower = 0
        """Requests long enough to split that stayed whole: the split was priced slower than the slack allows."""
        self.synced: deque[tuple[float, int, str, int, int, list[int], str, str]] = deque()
        """``router_sync``: choices on their way to the other routers (when they land, the router that chose, its
        replica, booking number, uncached tokens, keys, its router id, the request's id), in the order they land."""
        self.decisions: dict[str, RouteDecision] = {}
        """Routed requests without a first token yet -> their decision (its predicted TTFT, learned from)."""
        self.peer_holds = [PeerHolds(r) for r in self.routers]
        """Per router, the others' predictions it holds (``predict_hold_s``) until their requests' first tokens."""

    def pick_router(self) -> int:
        """The router the next request reaches (round-robin, or drawn with ``router_spread=random``)."""
        n = len(self.routers)
        if self._spread is not None:
            return self._spread.randrange(n)
        self._next += 1
        return (self._next - 1) % n

    def route(self, req: SimRequest, k: int | None = None) -> str:
        """Route ``req`` through router ``k`` (None: the next, ``pick_router``)."""
        now = req.routed_s if req.routed_s >= 0 else req.arrival_s  # later than its arrival: it waited in admission
        if self.synced:
            self._land_synced(now)
        k = req.router_index = self.pick_router() if k is None else k
        router = self.routers[k]
        session = req.session_id if self.config.use_sessions else None
        lora_name = req.lora_name if self.config.lora.adapter_aware else None  # adapter-blind: hidden (sim/lora.py)
        decision = router.route(req.all_token_ids, req.cache_salt, lora_name, exclude=self.pools.exclude(req.model),
                                now=now, session_id=session)
        rid = req.replica_id = decision.replica_id
        req.predicted_hit_tokens = decision.predicted_hit_tokens
        req.receipt = decision.receipt
        # the split is decided before the decode replica counts the request, as the HTTP router does (kv_handoff)
        choice = router.choose_split(decision, now=now)  # router/routing/kv_placement.py
        skipped, pid = choice.skipped, choice.prefill.id if choice.prefill is not None else None
        if pid is not None and self.config.pd_prefill_pick == "policy":
            pid = self._policy_prefill(router, decision.keys, req)
            skipped = None if pid is not None else SPLIT_NO_ROOM
        if pid is not None:
            self._split(req, k, decision.keys, pid)
        self._dispatch(k, rid, req, now)
        if self.config.router_sync and req.booking is not None:
            self.synced.append((now + self.config.sync_lag_s, k, rid, req.booking[1], self._uncached(req),
                                decision.keys, req.booking[0], req.request_id))
        self.decisions[req.request_id] = decision
        if session is not None and self.config.share_sessions:
            for other in self.routers:
                other.sessions.pin(session, rid, now)
        if self.config.share_predictions:
            for j in range(len(self.routers)):
                if j != k:
                    self._peer_predict(j, k, rid, decision.keys, now, req.request_id)
        if pid is None and decision.pull is not None:  # kept whole (short, no room, slower): the router's pull
            req.pull_from = decision.pull.holder.id
        if skipped == SPLIT_NO_ROOM:
            self.splits_skipped_no_room += 1
        elif skipped == SPLIT_SLOWER:
            self.splits_skipped_slower += 1
        return rid

    def _land_synced(self, now: float) -> None:
        """The other routers take the choices that reached them by ``now`` (``router_sync``)."""
        synced = self.synced
        while synced and synced[0][0] <= now:
            at, k, rid, number, uncached, keys, router_id, request_id = synced.popleft()
            for j, other in enumerate(self.routers):
                if j != k and (replica := other.replicas.get(rid)) is not None:
                    other.loads.peer_booked(replica, router_id, number, uncached, at)
                    self._peer_predict(j, k, rid, keys, at, request_id)

    def _peer_predict(self, j: int, k: int, rid: str, keys: list[int], at: float, request_id: str) -> None:
        """Router ``j`` takes router ``k``'s prediction on ``rid``: held while the request has no first token (with
        ``predict_hold_s``, router/routing/peer_holds.py), else for ``predict_ttl_s``."""
        if request_id in self.decisions and (replica := self.routers[j].replicas.get(rid)) is not None:
            self.peer_holds[j].hold(str(k), request_id, replica, keys, at)
        else:
            self.routers[j].index.predict(rid, keys, now=at)

    def _policy_prefill(self, router: KVRouter, keys: list[int], req: SimRequest) -> str | None:
        """``pd_prefill_pick=policy``: the routing policy's choice among the prefill replicas, if it has room."""
        candidates = Candidates.of(router.replicas.prefill())
        loads = candidates.loads
        matches = router.index.match(keys, now=req.arrival_s)
        device = {r: m for r, m in matches.items() if r in loads}  # the prefill replicas' pools (no host tier)
        chosen = router.policy.choose(keys, TierMatches(device), candidates, req.num_prompt_tokens)
        return pick_prefill_replica(loads, self.prefill_ids, router.transfers.pd_max_prefill_backlog_tokens, chosen.id)

    def _split(self, req: SimRequest, k: int, keys: list[int], pid: str) -> None:
        """Send ``req``'s prompt to prefill replica ``pid`` first (a leg the loop runs there)."""
        router = self.routers[k]
        leg = prefill_leg(req, pid)
        matched = router.index.match(keys, now=req.arrival_s).get(pid, 0)
        bs = self.block_size
        leg.predicted_hit_tokens = reusable_tokens(matched, req.num_prompt_tokens, bs)  # as KVRouter counts
        router.index.predict(pid, keys, now=req.arrival_s, start=matched)
        self._dispatch(k, pid, leg, req.arrival_s)

    def _dispatch(self, k: int, rid: str, req: SimRequest, now: float) -> None:
        """Router ``k`` counts ``req`` on ``rid`` (every router with ``share_loads``); its booking, when ``rid``
        publishes its load, goes with it (sim/published.py)."""
        for tracker in self._trackers(k):
            replica = tracker.replicas.get(rid)
            if replica is None:
                continue
            number = tracker.on_dispatch(replica, self._uncached(req), now=now, prompt_tokens=req.num_prompt_tokens)
            if number is not None and tracker is self.routers[k].loads:
                req.booking = (tracker.router_id, number)

    def _trackers(self, k: int) -> list[LoadTracker]:
        """The load trackers that count router ``k``'s requests: its own, or all with ``share_loads``."""
        return [r.loads for r in self.routers] if self.config.share_loads else [self.routers[k].loads]

    def _uncached(self, req: SimRequest) -> int:
        """Prompt tokens the router counts as ``req``'s prefill on its replica (a split's decode side: what its
        pull leaves, as the HTTP router counts it)."""
        uncached = req.num_prompt_tokens - req.predicted_hit_tokens
        if req.prefill_leg is not None:
            return min(uncached, tokens_left_after_split(req.num_prompt_tokens, self.block_size))
        return uncached

    def on_first_tokens(self, rid: str, reqs: list[SimRequest]) -> None:
        for r in reqs:
            for tracker in self._trackers(r.router_index):
                if (replica := tracker.replicas.get(rid)) is not None:
                    tracker.on_first_output(replica, self._uncached(r))
            decision = self.decisions.pop(r.request_id, None)
            self.receipts.record_actual(r.receipt, r.own_cached_tokens,  # the prediction was of its own pool
                                        keys=None if decision is None else decision.keys,
                                        output_tokens=r.max_output_tokens)
            if decision is not None:  # the router learns its correction from the TTFT it observes
                self.routers[r.router_index].observe_ttft(decision, r.first_token_s - r.arrival_s, r.ttft_target_s)
                self.routers[r.router_index].release_prediction(decision, now=r.first_token_s)
                if self.router.predict_hold_s > 0 and len(self.routers) > 1:  # the others' holds, once told
                    lag = self.config.sync_lag_s if self.config.router_sync else 0.0
                    for holds in self.peer_holds:  # its own router holds none of its own: a no-op there
                        holds.release(str(r.router_index), r.request_id, r.first_token_s + lag)

    def on_prefill_done(self, pid: str, leg: SimRequest) -> None:
        """A prefill leg answered (its one token): the prefill replica's load drops."""
        for tracker in self._trackers(leg.router_index):
            if (replica := tracker.replicas.get(pid)) is not None:  # the trace names replicas by id
                tracker.on_first_output(replica, self._uncached(leg))
                tracker.on_finish(replica, self._uncached(leg), had_output=True)

    def on_finished(self, rid: str, reqs: list[SimRequest]) -> None:
        for r in reqs:
            for tracker in self._trackers(r.router_index):
                if (replica := tracker.replicas.get(rid)) is not None:
                    tracker.on_finish(replica, self._uncached(r), had_output=True)

    def apply(self, rid: str, events: list) -> None:
        t0 = time.perf_counter()
        for router in self.routers:
            router.apply_events(rid, events)
        self.apply_s += time.perf_counter() - t0
        self.num_events += len(events)

    def apply_load(self, rid: str, update: ReplicaLoadUpdate, now: float) -> None:
        """Every router takes the load replica ``rid`` published (``published_loads``)."""
        for router in self.routers:
            if (replica := router.replicas.get(rid)) is not None:
                router.loads.apply_published(replica, update, now)

    def poll(self, k: int, replicas: list[SimReplica], now: float) -> None:
        """Router ``k`` reads the ``/load`` of every replica it knows at ``now`` (as ``RouterRuntime`` polls it)."""
        loads = self.routers[k].loads.loads
        aware = self.config.lora.adapter_aware
        for rep in replicas:
            if rep.replica_id in loads:
                loads[rep.replica_id].update_report(rep.load_report(), now)
                report_lora(loads[rep.replica_id], rep.lora.section(rep.running) if aware else None)

    def add_replica(self, rid: str, num_kv_blocks: int, role: str = "both") -> None:
        """A replica of ``role`` joins every router: healthy, with an empty tree (a cold cache), and what a real
        replica measures and reports in ``/load`` taken from the cost model (``sim_load_rates``), its cache's
        ``num_kv_blocks`` (the null block included) with it. Its KV transfer is on with ``peer_pulls`` (the router
        plans pulls only between replicas that report it on)."""
        if role == "prefill":
            self.prefill_ids.append(rid)
        for router in self.routers:
            router.add_replica(rid, role=role)
            sim_load_rates(router.loads.loads[rid], self.config, num_kv_blocks)

    def remove_replica(self, rid: str) -> None:
        for router in self.routers:
            router.remove_replica(rid)

    def set_healthy(self, rid: str, healthy: bool) -> None:
        for router in self.routers:  # the trace names a replica by id: each router's record of it
            replica = router.replicas.get(rid)
            if replica is not None:
                router.set_healthy(replica, healthy)
