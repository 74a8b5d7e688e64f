"""The simulator's discrete-event loop: arrivals -> router (real index + policy) -> simulated replicas,
with the replicas' KV events flowing back into the index as they happen (optionally delayed).

Events are ordered by (time, insertion order) so runs are deterministic; their kinds, and what each carries, are in
sim/event_kinds.py.

The run ends when every request has arrived and no event but a recurring timer is left; a request
still unfinished then is an error.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

from kvmesh.cluster.measure.sim import event_kinds as kinds
from kvmesh.cluster.measure.sim.admission import make_admission
from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.event_kinds import Payload
from kvmesh.cluster.measure.sim.lora import ModelPools
from kvmesh.cluster.measure.sim.published import SimLoadPublishing
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.measure.sim.router import SimRouter
from kvmesh.cluster.measure.sim.sim_run import SimRun
from kvmesh.cluster.measure.sim.transfer import plan_peer_pull, plan_split_handoff
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.router.control.turns import turn_wait_s
from kvmesh.router.routing.policies import Policy


class FleetPolicy(Protocol):
    """How many replicas serve over a run: a fixed count, or a policy that adds and drains them."""

    def initial_replicas(self, config: SimConfig) -> int:
        """Replicas at time 0."""
        ...

    def begin(self, sim: Simulation) -> None:
        """Before the first arrival (schedule the fleet's timers)."""
        ...

    def on_event(self, sim: Simulation, now: float, kind: int, payload: Payload) -> None:
        """A ``FLEET_TIMER`` or ``FLEET_EVENT`` this fleet pushed has come due."""
        ...

    def after_step(self, sim: Simulation, rep: SimReplica, now: float) -> None:
        """``rep`` finished a step and planned its next."""
        ...

    def extra(self, sim: Simulation) -> dict:
        """What goes into ``SimRun.extra``."""
        ...


class FixedFleet:
    """``config.num_replicas`` replicas (and ``num_prefill_replicas`` prefill ones) from start to end."""

    def initial_replicas(self, config: SimConfig) -> int:
        return config.total_replicas

    def begin(self, sim: Simulation) -> None:
        pass

    def on_event(self, sim: Simulation, now: float, kind: int, payload: Payload) -> None:
        raise AssertionError("a fixed fleet pushes no events")

    def after_step(self, sim: Simulation, rep: SimReplica, now: float) -> None:
        pass

    def extra(self, sim: Simulation) -> dict:
        return {}


class Simulation:
    """One run's state: replicas, router, the event heap; ``run`` drives it to the end."""

    def __init__(self, policy: str, requests: list[SimRequest], config: SimConfig, blocks_per_replica: int,
                 tokens: BlockTokenCache, fleet: FleetPolicy) -> None:
        self.config = config
        self.requests = requests
        self.tokens = tokens
        self.fleet = fleet
        self.blocks_per_replica = blocks_per_replica
        self.seed = config.seed.to_bytes(8, "big") * 4  # fixed per run: replicas are independent caches
        self.replicas = [SimReplica(str(i), blocks_per_replica, config, self.seed, config.role_of(i))
                         for i in range(fleet.initial_replicas(config))]
        self.by_id = {rep.replica_id: rep for rep in self.replicas}
        """Replica id (``str`` of its index, as the router knows it) -> the replica."""
        self.router = SimRouter(policy, config, self.replicas)
        self.router.pools = ModelPools.of(requests, [r.replica_id for r in self.replicas if r.role != "prefill"])
        self.router.receipts.ceiling.capacity_blocks = lambda: blocks_per_replica * len(self.replicas)  # live ceiling
        self.policy = policy
        self._heap: list[tuple[float, int, int, Payload]] = []
        self._order = itertools.count()
        self._pending = 0  # events in the heap that are not recurring timers
        self._next_arrival = 0
        self._moving = 0  # requests in a KV transfer
        self._deciding = 0  # requests waiting for their router's turn (``router_turn_s``)
        self.route_s = 0.0
        self.admission = make_admission(config, self)
        self.publishing = SimLoadPublishing() if config.published_loads else None
        """What the replicas accepted per router and publish after their steps (sim/published.py); None: they
        do not publish their load."""

    def push(self, at: float, kind: int, payload: Payload) -> None:
        if kind not in kinds.RECURRING:
            self._pending += 1
        heapq.heappush(self._heap, (at, next(self._order), kind, payload))

    def new_replica(self) -> SimReplica:
        """A replica appended to the fleet (not yet known to the router)."""
        rep = SimReplica(str(len(self.replicas)), self.blocks_per_replica, self.config, self.seed)
        self.replicas.append(rep)
        self.by_id[rep.replica_id] = rep
        return rep

    def flush(self, rep: SimReplica, now: float) -> None:
        events = rep.take_events()
        if not events:
            return
        if self.config.event_delay_s == 0:
            self.router.apply(rep.replica_id, events)
        else:
            self.push(now + self.config.event_delay_s, kinds.EVENTS, (rep.replica_id, events))

    def start(self, rep: SimReplica, now: float) -> None:
        step = rep.schedule(now)
        self.flush(rep, now)  # allocation stores blocks and may evict others
        if step is not None:
            self.push(step.end_s, kinds.STEP_END, (rep, rep.version))

    def busy(self) -> bool:
        return self._next_arrival < len(self.requests) or self._moving > 0 or self._deciding > 0 or any(
            rep.step is not None or rep.waiting for rep in self.replicas) or (
            self.admission is not None and self.admission.num_waiting > 0)

    def arrive(self, req: SimRequest) -> None:
        req.all_token_ids = self.tokens.prompt(req.hash_ids, req.num_prompt_tokens)
        if self.admission is not None:
            self.admission.arrive(req, req.arrival_s)  # it dispatches now, later, or sheds
            if req.shed_reason is not None:
                req.all_token_ids = []
            return
        turn, n = self.config.turn_s, len(self.router.routers)
        k = self.router.pick_router() if turn > 0 and n > 1 else None  # a router alone has no one to wait for
        at = req.arrival_s if k is None else req.arrival_s + turn_wait_s(req.arrival_s, turn, k, n)
        if at > req.arrival_s:
            self._deciding += 1
            self.push(at, kinds.DECIDE, (req, k))
        else:
            self.dispatch(req, at, k)

    def wake_at(self, at: float) -> None:
        self.push(at, kinds.ADMIT, None)

    def dispatch(self, req: SimRequest, now: float, router: int | None = None) -> None:
        """Route ``req`` at ``now`` (its arrival, its router's turn, or when admission let it go) through simulated
        router ``router`` (None: the next) and queue it."""
        req.routed_s = now
        t0 = time.perf_counter()
        rep = self.by_id[self.router.route(req, router)]
        self.route_s += time.perf_counter() - t0
        if req.prefill_leg is not None:  # split: the prompt first goes to the prefill replica
            self.enqueue(self.by_id[req.prefill_leg.replica_id], req.prefill_leg, now)
        elif req.pull_from is not None:
            self.move(rep, req, now + plan_peer_pull(req, self.by_id[req.pull_from], rep))
        else:
            self.enqueue(rep, req, now)

    def enqueue(self, rep: SimReplica, req: SimRequest, now: float) -> None:
        rep.add(req)
        if self.publishing is not None:
            self.publishing.accept(rep.replica_id, req, now)
            self.publish_load(rep, now, accepted=True)
        if rep.step is None:
            self.start(rep, now)
        else:
            new_end = rep.interrupt(now)
            if new_end is not None:
                self.push(new_end, kinds.STEP_END, (rep, rep.version))

    def move(self, rep: SimReplica, req: SimRequest, at: float) -> None:
        """``req`` joins ``rep``'s queue at ``at``, when its KV transfer ends."""
        self._moving += 1
        self.push(at, kinds.MOVED, (rep, req))

    def step_end(self, rep: SimReplica, version: int, now: float) -> None:
        if version != rep.version:
            return  # a stretch that was cut short; its new end is queued
        first, finished = rep.complete_step(now)
        legs = [r for r in finished if r.parent is not None]
        if legs:  # prefill legs answer the router, not a client
            first = [r for r in first if r.parent is None]
            finished = [r for r in finished if r.parent is None]
        self.router.on_first_tokens(rep.replica_id, first)
        self.router.on_finished(rep.replica_id, finished)
        for leg in legs:
            self.router.on_prefill_done(rep.replica_id, leg)
            req = leg.parent
            req.prefill_computed_tokens = leg.num_prompt_tokens - leg.num_cached_tokens
            decode = self.by_id[req.replica_id]
            self.move(decode, req, now + plan_split_handoff(req, decode))
        self.flush(rep, now)
        self.publish_load(rep, now)
        self.start(rep, now)
        self.fleet.after_step(self, rep, now)
        if self.admission is not None:
            self.admission.finished(finished, now)
            self.admission.pump(now)

    def publish_load(self, rep: SimReplica, now: float, force: bool = False, due: bool = False,
                     accepted: bool = False) -> None:
        """``rep``'s load changed: a request joined (``accepted``: published now), or a step ended (published now
        if its last update is ``load_publish_interval_s`` old, else when it is; ``due``: that time came); every
        router takes it ``load_publish_lag_s`` later."""
        publishing = self.publishing
        if publishing is None:
            return
        wait = publishing.wait(rep.replica_id, now, self.config.load_publish_interval_s, due, accepted)
        if wait is None:
            return
        if wait > 0:
            self.push(now + wait, kinds.LOAD_DUE, rep)
            return
        update = publishing.update(rep, now, rep.num_steps, force)
        if update is not None:
            self.push(now + self.config.load_publish_lag_s, kinds.LOAD, (rep.replica_id, update))

    def _schedule_polls(self) -> None:
        if self.requests:  # a replica's first update: empty (routers book on it from then on)
            for rep in self.replicas:
                self.publish_load(rep, self.requests[0].arrival_s, force=True)
        poll, n = self.config.load_poll_s, self.config.num_routers
        if poll > 0 and self.requests:
            t0 = self.requests[0].arrival_s
            for k in range(n):
                self.push(t0 + poll * k / n, kinds.POLL, k)

    def run(self, progress: Callable[[int], None] | None = None) -> None:
        self._schedule_polls()
        self.fleet.begin(self)
        requests, heap = self.requests, self._heap
        n = len(requests)
        while self._next_arrival < n or self._pending:
            i = self._next_arrival
            if i < n and (not heap or requests[i].arrival_s <= heap[0][0]):
                self._next_arrival += 1
                self.arrive(requests[i])
                if progress is not None:
                    progress(1)
                continue
            now, _, kind, payload = heapq.heappop(heap)
            if kind not in kinds.RECURRING:
                self._pending -= 1
            if kind == kinds.STEP_END:
                self.step_end(*payload, now)
            elif kind == kinds.EVENTS:
                self.router.apply(*payload)
            elif kind == kinds.LOAD:
                self.router.apply_load(*payload, now)
            elif kind == kinds.LOAD_DUE:
                self.publish_load(payload, now, due=True)
            elif kind == kinds.MOVED:
                self._moving -= 1
                self.enqueue(*payload, now)
            elif kind == kinds.DECIDE:
                self._deciding -= 1
                self.dispatch(payload[0], now, payload[1])
            elif kind == kinds.ADMIT:
                self.admission.pump(now, expire=True)
            elif kind == kinds.POLL:
                self.router.poll(payload, self.replicas, now)
                if self.busy():
                    self.push(now + self.config.load_poll_s, kinds.POLL, payload)
            else:
                self.fleet.on_event(self, now, kind, payload)
        unfinished = [r.request_id for r in requests if r.finished_s < 0 and r.shed_reason is None]
        if unfinished:
            raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished requests, e.g. {unfinished[:3]}")


def run_policy(policy: str, requests: list[SimRequest], config: SimConfig, blocks_per_replica: int,
               tokens: BlockTokenCache, progress: Callable[[int], None] | None = None,
               fleet: FleetPolicy | None = None, routed_by: Policy | None = None) -> SimRun:
    """Simulate ``requests`` (fresh, sorted by arrival) under ``policy`` on ``fleet`` (default: a fixed
    fleet of ``config.num_replicas``); returns the run. ``routed_by``: a policy object that chooses in place of
    ``policy``'s, with one router (sim/placement_replay.py)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sim = Simulation(policy, requests, config, blocks_per_replica, tokens, fleet or FixedFleet())
    if routed_by is not None:
        if config.num_routers != 1:
            raise ValueError("a policy object routes for one router only")
        sim.router.routers[0].policy = routed_by
    sim.run(progress)
    return SimRun(policy, requests, sim.replicas, sim.router, time.perf_counter() - wall0,
                  time.process_time() - cpu0, sim.route_s, sim.fleet.extra(sim))
