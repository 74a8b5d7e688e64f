"""The discrete-event loop: arrivals -> router (real index + policy) -> simulated replicas,
with the replicas' KV events flowing back into the index as they happen (optionally delayed).

Three kinds of events, ordered by (time, insertion order) so runs are deterministic:

- arrival: tokenize (token ids per hash id), compute router keys, match, choose, enqueue;
- step end: a replica finishes a step (or a stretch of decode steps), frees finished requests,
  plans its next step;
- event delivery: a batch of a replica's BlockStored/BlockRemoved reaches the index;
- load poll (``load_poll_s > 0``): one router reads every replica's ``/load``; the routers' polls
  are staggered over the interval.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvmesh.cluster.benchmarks.traces import BlockTokenCache
from kvmesh.cluster.sim.config import SimConfig
from kvmesh.cluster.sim.replica import SimReplica
from kvmesh.cluster.sim.request import SimRequest
from kvmesh.cluster.sim.router_adapter import SimRouter

_STEP_END, _EVENTS, _POLL = 0, 1, 2


@dataclass
class SimRun:
    """Everything one policy's run produced (summarized by :mod:`.metrics`)."""

    policy: str
    requests: list[SimRequest]
    replicas: list[SimReplica]
    router: SimRouter
    wall_s: float = 0.0
    cpu_s: float = 0.0  # process CPU seconds (wall time on a shared machine overstates the cost)
    route_s: float = 0.0  # wall seconds in key computation + match + choose
    extra: dict = field(default_factory=dict)


def run_policy(policy: str, requests: list[SimRequest], config: SimConfig, blocks_per_replica: int,
               tokens: BlockTokenCache, progress: Callable[[int], None] | None = None) -> SimRun:
    """Simulate ``requests`` (fresh, sorted by arrival) under ``policy``; returns the run."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    seed = config.seed.to_bytes(8, "big") * 4  # fixed per run: replicas are independent caches
    replicas = [SimReplica(i, blocks_per_replica, config, seed) for i in range(config.num_replicas)]
    router = SimRouter(policy, config, replicas)
    heap: list[tuple[float, int, int, object]] = []
    order = itertools.count()
    delay = config.event_delay_s

    def flush(rep: SimReplica, now: float) -> None:
        events = rep.take_events()
        if not events:
            return
        if delay == 0:
            router.apply(rep.replica_id, events)
        else:
            heapq.heappush(heap, (now + delay, next(order), _EVENTS, (rep.replica_id, events)))

    def start(rep: SimReplica, now: float) -> None:
        step = rep.schedule(now)
        flush(rep, now)  # allocation stores blocks and may evict others
        if step is not None:
            heapq.heappush(heap, (step.end_s, next(order), _STEP_END, (rep, rep.version)))

    poll = config.load_poll_s
    if poll > 0 and requests:
        t0 = requests[0].arrival_s
        for k in range(config.num_routers):
            heapq.heappush(heap, (t0 + poll * k / config.num_routers, next(order), _POLL, k))

    def busy() -> bool:
        return any(rep.step is not None or rep.waiting for rep in replicas)

    route_s = 0.0
    i, n = 0, len(requests)
    while i < n or heap:
        if i < n and (not heap or requests[i].arrival_s <= heap[0][0]):
            req = requests[i]
            i += 1
            now = req.arrival_s
            req.all_token_ids = tokens.prompt(req.hash_ids, req.num_prompt_tokens)
            t0 = time.perf_counter()
            rid = router.route(req)
            route_s += time.perf_counter() - t0
            rep = replicas[rid]
            rep.add(req)
            if rep.step is None:
                start(rep, now)
            else:
                new_end = rep.interrupt(now)
                if new_end is not None:
                    heapq.heappush(heap, (new_end, next(order), _STEP_END, (rep, rep.version)))
            if progress is not None:
                progress(1)
            continue
        now, _, kind, payload = heapq.heappop(heap)
        if kind == _EVENTS:
            rid, events = payload
            router.apply(rid, events)
            continue
        if kind == _POLL:
            router.poll(payload, replicas)
            if i < n or busy():
                heapq.heappush(heap, (now + poll, next(order), _POLL, payload))
            continue
        rep, version = payload
        if version != rep.version:
            continue  # a stretch that was cut short; its new end is queued
        first, finished = rep.complete_step(now)
        router.on_first_tokens(rep.replica_id, first)
        router.on_finished(rep.replica_id, finished)
        flush(rep, now)
        start(rep, now)
    unfinished = [r.request_id for r in requests if r.finished_s < 0]
    if unfinished:
        raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished requests, e.g. {unfinished[:3]}")
    return SimRun(policy, requests, replicas, router, time.perf_counter() - wall0, time.process_time() - cpu0,
                  route_s)
