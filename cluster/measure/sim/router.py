"""The real router in front of the simulated replicas: a ``KVRouter`` (``RouterKeyHasher``,
``PrefixIndex`` with predictions, ``LoadTracker``, a policy from the registry), fed in-process (no
sockets) with the replicas' KV events and driven in simulated time.

Loads are what the HTTP router itself knows (its ``LoadTracker`` counters: requests in flight,
uncached prompt tokens not yet past prefill) plus, with ``load_poll_s > 0``, the replicas'
``/load`` reports as of the router's last poll.

Roles and moves (sim/transfer.py): prefill replicas are in every router's index and load table but never
candidates for a request's decode; a request whose uncached suffix on its decode replica is long enough gets
a prefill leg on the least loaded prefill replica with room (``SimRequest.prefill_leg``), and, with
``peer_pulls``, a request sent away from the best prefix holder is told to pull from it when that is
cheaper (``SimRequest.pull_from``).

With ``num_routers > 1`` there are N such routers, as ``kvmesh router --workers N`` runs them:
each applies every replica's events to its own index, keeps its own predictions, counters and
session pins, and sees only the requests spread to it (and the polled reports).
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.measure.sim.transfer import (
    find_holder,
    pd_min_uncached_tokens,
    pick_prefill_replica,
    prefill_leg,
    pull_is_cheaper,
    router_rule,
)
from kvmesh.router.routing.load import LoadTracker
from kvmesh.router.routing.policies import Policy


def available_policies() -> list[str]:
    from kvmesh.router.routing.policies import POLICIES

    return list(POLICIES)


def build_policy(name: str, config: SimConfig, seed: int) -> Policy:
    """Policy ``name`` with the knobs of ``config.policy_kwargs`` it takes and the replicas' step budget."""
    from kvmesh.router.routing.policies import get_policy, policy_config, with_step_budget

    options = with_step_budget(name, config.policy_kwargs, config.engine.max_num_batched_tokens)
    return get_policy(name, policy_config(name, options, drop_unknown=True), config.engine.block_size, seed)


class SimRouter:
    """``num_routers`` real ``KVRouter``s driven in simulated time, plus the dispatch/first-token/
    finish load accounting and the receipts the HTTP front keeps around each of them."""

    def __init__(self, policy: str, config: SimConfig, replicas: list[SimReplica]) -> None:
        from kvmesh.router.config import build_router
        from kvmesh.router.routing.keys import DEFAULT_ROUTER_SEED
        from kvmesh.router.routing.receipts import Receipts

        self.block_size = config.engine.block_size
        self.config = config
        section = replace(config.router, policy=policy, policy_kwargs={})
        self.routers = [build_router(section, DEFAULT_ROUTER_SEED, build_policy(policy, config, config.seed + k))
                        for k in range(config.num_routers)]
        self.prefill_ids: list[int] = []
        """Replicas of role prefill (in the routers, never a decode candidate)."""
        for rep in replicas:
            self.add_replica(rep.replica_id, getattr(rep, "role", "both"))
        self.router = self.routers[0]
        self.index = self.router.index
        self.tracker = self.router.loads
        self.policy_name = policy
        self.receipts = Receipts()
        """Every request's receipt, completed with the cached tokens its replica found on admission."""
        self._spread = random.Random(config.seed) if config.router_spread == "random" else None
        self._next = 0
        self._pd_min_uncached = pd_min_uncached_tokens(config)
        self._pd_max_backlog = int(router_rule(config, "pd_max_prefill_backlog_tokens"))
        self._pulls = config.peer_pulls and bool(router_rule(config, "peer_pulls"))
        # -- measured --
        self.num_events = 0
        self.apply_s = 0.0
        self.splits_skipped_no_room = 0
        """Requests long enough to split that stayed whole: no prefill replica had room."""
        self.pulls_not_cheaper = 0
        """Requests sent away from a better prefix holder where recomputing was cheaper than pulling."""

    def _pick_router(self) -> int:
        n = len(self.routers)
        if self._spread is not None:
            return self._spread.randrange(n)
        self._next += 1
        return (self._next - 1) % n

    def route(self, req: SimRequest) -> int:
        k = req.router_index = self._pick_router()
        router = self.routers[k]
        session = req.session_id if self.config.use_sessions else None
        decision = router.route(req.all_token_ids, req.cache_salt, req.lora_name, now=req.arrival_s,
                                session_id=session)
        rid = req.replica_id = decision.replica_id
        req.predicted_hit_tokens = decision.predicted_hit_tokens
        req.receipt = decision.receipt
        for tracker in self._trackers(k):
            tracker.on_dispatch(rid, self._uncached(req), now=req.arrival_s)
        if session is not None and self.config.share_sessions:
            for other in self.routers:
                other.sessions.pin(session, rid, req.arrival_s)
        if self.config.share_predictions:
            for other in self.routers:
                if other is not router:
                    other.index.predict(rid, decision.keys, now=req.arrival_s)
        if self.prefill_ids and decision.uncached_tokens >= self._pd_min_uncached and self._split(req, k, decision.keys):
            pass
        elif self._pulls:  # not split (short, or no prefill replica had room): a pull may still pay
            self._maybe_pull(req, router, decision.keys, decision.matched_blocks)
        return rid

    def _split(self, req: SimRequest, k: int, keys: list[int]) -> bool:
        """Send ``req``'s prompt to the least loaded prefill replica with room (a leg the loop runs there);
        False when none has room."""
        router = self.routers[k]
        matches = router.index.match(keys, now=req.arrival_s)
        chosen = None
        if self.config.pd_prefill_pick == "policy":
            loads = {r: router.loads.loads[r] for r in self.prefill_ids}
            chosen = router.policy.choose(keys, {r: m for r, m in matches.items() if r in loads}, loads,
                                          req.num_prompt_tokens)
        pid = pick_prefill_replica(router.loads.loads, self.prefill_ids, self._pd_max_backlog, chosen)
        if pid is None:
            self.splits_skipped_no_room += 1
            return False
        leg = prefill_leg(req, pid)
        matched = matches.get(pid, 0)
        bs = self.block_size
        leg.predicted_hit_tokens = min(matched * bs, (req.num_prompt_tokens - 1) // bs * bs)  # as KVRouter counts
        router.index.predict(pid, keys, now=req.arrival_s, start=matched)
        for tracker in self._trackers(k):
            tracker.on_dispatch(pid, self._uncached(leg), now=req.arrival_s)
        return True

    def _maybe_pull(self, req: SimRequest, router, keys: list[int], own_blocks: int) -> None:
        """The router's peer-pull rule: the replica (any role) holding more of the prompt than the chosen one
        lends its extra blocks when moving them is cheaper than computing them."""
        bs = self.block_size
        matches = router.index.match(keys, now=req.arrival_s)
        holder, extra = find_holder(matches, req.replica_id, own_blocks, (req.num_prompt_tokens - 1) // bs)
        if holder is None:
            return
        if pull_is_cheaper(self.config, extra * bs):
            req.pull_from = holder
        else:
            self.pulls_not_cheaper += 1

    def _trackers(self, k: int) -> list[LoadTracker]:
        """The load trackers that count router ``k``'s requests: its own, or all with ``share_loads``."""
        return [r.loads for r in self.routers] if self.config.share_loads else [self.routers[k].loads]

    def _uncached(self, req: SimRequest) -> int:
        return req.num_prompt_tokens - req.predicted_hit_tokens

    def on_first_tokens(self, rid: int, reqs: list[SimRequest]) -> None:
        for r in reqs:
            for tracker in self._trackers(r.router_index):
                tracker.on_first_output(rid, self._uncached(r))
            self.receipts.record_actual(r.receipt, r.own_cached_tokens)  # the prediction was of its own pool

    def on_prefill_done(self, pid: int, leg: SimRequest) -> None:
        """A prefill leg answered (its one token): the prefill replica's load drops."""
        for tracker in self._trackers(leg.router_index):
            tracker.on_first_output(pid, self._uncached(leg))
            tracker.on_finish(pid, self._uncached(leg), had_output=True)

    def on_finished(self, rid: int, reqs: list[SimRequest]) -> None:
        for r in reqs:
            for tracker in self._trackers(r.router_index):
                tracker.on_finish(rid, self._uncached(r), had_output=True)

    def apply(self, rid: int, events: list) -> None:
        t0 = time.perf_counter()
        for router in self.routers:
            router.apply_events(rid, events)
        self.apply_s += time.perf_counter() - t0
        self.num_events += len(events)

    def poll(self, k: int, replicas: list[SimReplica]) -> None:
        """Router ``k`` reads the ``/load`` of every replica it knows (as ``RouterRuntime`` polls it)."""
        loads = self.routers[k].loads.loads
        for rep in replicas:
            if rep.replica_id in loads:
                loads[rep.replica_id].update_report(rep.load_report())

    def add_replica(self, rid: int, role: str = "both") -> None:
        """A replica joins every router: healthy, with an empty tree (a cold cache), and the rates a real
        replica measures and reports in ``/load`` taken from the cost model (block bytes counted as one
        per token: only the ratios matter). A prefill replica joins out of the decode candidates: the
        routers index its blocks and count its load, and their policies never choose it."""
        cost = self.config.cost
        if role == "prefill":
            self.prefill_ids.append(rid)
        for router in self.routers:
            router.add_replica(rid, healthy=role != "prefill")
            load = router.loads.loads[rid]
            load.prefill_tokens_per_s = 1 / cost.prefill_s_per_token if cost.prefill_s_per_token else None
            load.kv_block_bytes = self.config.engine.block_size
            load.h2d_bytes_per_s = 1 / cost.load_s_per_token if cost.load_s_per_token else None

    def remove_replica(self, rid: int) -> None:
        for router in self.routers:
            router.remove_replica(rid)

    def set_healthy(self, rid: int, healthy: bool) -> None:
        for router in self.routers:
            router.set_healthy(rid, healthy)
