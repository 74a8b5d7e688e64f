"""Running the simulator: the discrete-event loop, and several policies over one trace.

The discrete-event loop: arrivals -> router (real index + policy) -> simulated replicas,
with the replicas' KV events flowing back into the index as they happen (optionally delayed).

Three kinds of events, ordered by (time, insertion order) so runs are deterministic:

- arrival: tokenize (token ids per hash id), compute router keys, match, choose, enqueue;
- step end: a replica finishes a step (or a stretch of decode steps), frees finished requests,
  plans its next step;
- event delivery: a batch of a replica's BlockStored/BlockRemoved reaches the index;
- load poll (``load_poll_s > 0``): one router reads every replica's ``/load``; the routers' polls
  are staggered over the interval.

Run several policies on the same trace and collect one report (with both ceilings).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from kvmesh.cluster.benchmarks.traces import BlockTokenCache, MooncakeRecord
from kvmesh.cluster.sim.config import SimConfig
from kvmesh.cluster.sim.replica import SimReplica, SimRequest, requests_from_mooncake
from kvmesh.cluster.sim.report import infinite_hit_rate, single_pool_hits, summarize
from kvmesh.cluster.sim.router import SimRouter

_STEP_END, _EVENTS, _POLL = 0, 1, 2


@dataclass
class SimRun:
    """Everything one policy's run produced (summarized by :mod:`.report`)."""

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


def working_set_blocks(records: list[MooncakeRecord]) -> int:
    """Distinct hash ids of the trace (one block each)."""
    ids: set[int] = set()
    for r in records:
        ids.update(r.hash_ids)
    return len(ids)


def blocks_per_replica(config: SimConfig, records: list[MooncakeRecord]) -> int:
    if config.blocks_per_replica is not None:
        return config.blocks_per_replica
    return max(1, math.ceil(config.capacity_fraction * working_set_blocks(records) / config.num_replicas))


def compare_policies(records: list[MooncakeRecord], config: SimConfig, policies: list[str],
                     show_progress: bool = True, with_ceilings: bool = True,
                     variants: dict[str, dict] | None = None) -> dict:
    """Simulate every policy on ``records``; returns the JSON-ready report.

    ``variants`` runs each policy once per entry, label suffix -> ``SimConfig`` fields to change
    (e.g. ``{" 1 router": {"num_routers": 1}, " 4 routers": {"num_routers": 4}}``); the report
    names each run ``policy + suffix``. Default: one run per policy with ``config`` as given.
    """
    from tqdm import tqdm

    tokens = BlockTokenCache(config.block_size, config.vocab_size, config.seed)
    per_replica = blocks_per_replica(config, records)
    total_blocks = per_replica * config.num_replicas

    def fresh():
        return requests_from_mooncake(records, config.time_scale, config.block_size)

    largest = max(math.ceil((r.num_prompt_tokens + r.max_output_tokens) / config.block_size) for r in fresh())
    if largest > per_replica:
        raise ValueError(f"the largest request needs {largest} blocks but a replica holds {per_replica}: "
                         "raise --blocks-per-replica / --capacity-fraction or use fewer replicas")
    report: dict = {
        "config": _config_dict(config),
        "trace": {"requests": len(records), "working_set_blocks": working_set_blocks(records),
                  "duration_s": (records[-1].arrival_s - records[0].arrival_s) * config.time_scale},
        "blocks_per_replica": per_replica,
        "total_blocks": total_blocks,
        "ceilings": {},
        "policies": {},
    }
    pool_hits = None
    if with_ceilings:
        t0 = time.perf_counter()
        reqs = fresh()
        pool_hits = single_pool_hits(reqs, total_blocks, config.block_size, tokens)
        report["ceilings"] = {
            "infinite_cache_hit_rate": infinite_hit_rate(reqs, config.block_size),
            "single_pool_hit_rate": sum(pool_hits) / max(1, sum(r.num_prompt_tokens for r in reqs)),
            "wall_s": time.perf_counter() - t0,
        }
    runs = [(name + suffix, name, replace(config, **changes))
            for name in policies for suffix, changes in (variants or {"": {}}).items()]
    for label, name, cfg in runs:
        with tqdm(total=len(records), desc=f"sim {label}", unit="req", disable=not show_progress,
                  leave=False) as bar:
            run = run_policy(name, fresh(), cfg, per_replica, tokens, progress=bar.update)
        summary = summarize(run, pool_hits)
        ceiling = report["ceilings"].get("single_pool_hit_rate")
        if ceiling:
            summary["hit_rate_vs_single_pool"] = summary["hit_rate"] / ceiling
        report["policies"][label] = summary
    return report


def _config_dict(config: SimConfig) -> dict:
    d = asdict(config)
    d["cost"] = asdict(config.cost)
    return d
