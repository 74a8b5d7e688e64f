"""Replicas joining and leaving over a trace: the live autoscaler's policy, in simulated time.

The loop is ``run.run_policy``'s (arrivals -> real router -> simulated replicas, events back to the
index) plus two kinds of events:

- tick (every ``autoscale.decision_interval_s``): the replicas' rows as ``GET /replicas`` gives them (the
  router's in-flight counts and prefill backlog) go to ``cluster.autoscaler.Autoscaler``; "up"
  creates replicas that join the router ``startup_s`` later (a cold cache), "down" drains the
  replica ``cheapest_to_lose`` picks from the index's exclusive blocks (``router/retention.py``);
- a drained replica with nothing in flight leaves: the router drops it and its replica-seconds stop.

``vary_rate`` turns a trace into one whose rate alternates between slow and fast phases, and
``compare_with_fixed`` runs it autoscaled and on a fixed fleet sized for the peak (``max_replicas``):
replica-seconds and TTFT p90 side by side. ``kvmesh sim scaling`` (``python -m kvmesh.cluster.sim.scaling``) writes that report.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import time
from dataclasses import replace

from kvmesh.cluster.autoscaler import AutoscaleConfig, Autoscaler, cheapest_to_lose
from kvmesh.cluster.benchmarks.traces import BlockTokenCache
from kvmesh.cluster.sim.config import SimConfig
from kvmesh.cluster.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.sim.report import percentiles, summarize
from kvmesh.cluster.sim.router import SimRouter
from kvmesh.cluster.sim.run import SimRun, run_policy
from kvmesh.router.routing.retention import exclusive_blocks

_STEP_END, _EVENTS, _TICK, _JOIN = 0, 1, 2, 3


def vary_rate(requests: list[SimRequest], period_s: float, slow_factor: float) -> list[SimRequest]:
    """Arrival times warped so the rate alternates: ``period_s`` of trace time at 1/``slow_factor``
    of its rate, then ``period_s`` at its own rate, and so on (the requests are changed in place)."""
    for req in requests:
        t = req.arrival_s
        whole, part = divmod(t, 2 * period_s)
        slow_part = min(part, period_s)
        req.arrival_s = whole * period_s * (slow_factor + 1) + slow_part * slow_factor + max(0.0, part - period_s)
    return sorted(requests, key=lambda r: r.arrival_s)


def run_autoscaled(policy: str, requests: list[SimRequest], config: SimConfig, blocks_per_replica: int,
                   tokens: BlockTokenCache, autoscale: AutoscaleConfig, startup_s: float) -> SimRun:
    """``run_policy`` with ``autoscale.min_replicas`` replicas to start and the autoscaler deciding."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    seed = config.seed.to_bytes(8, "big") * 4
    replicas = [SimReplica(i, blocks_per_replica, config, seed) for i in range(autoscale.min_replicas)]
    router = SimRouter(policy, config, replicas)
    kv = router.router
    scaler = Autoscaler(autoscale)
    born = {rep.replica_id: 0.0 for rep in replicas}   # replica -> when it was asked for
    gone: dict[int, float] = {}                          # replica -> when it left
    starting: set[int] = set()
    draining: set[int] = set()
    timeline: list[tuple[float, int]] = [(0.0, len(replicas))]
    decisions: list[dict] = []
    heap: list[tuple[float, int, int, object]] = []
    order = itertools.count()

    def push(at: float, kind: int, payload: object) -> None:
        heapq.heappush(heap, (at, next(order), kind, payload))

    def flush(rep: SimReplica, now: float) -> None:
        events = rep.take_events()
        if events:
            if config.event_delay_s == 0:
                router.apply(rep.replica_id, events)
            else:
                push(now + config.event_delay_s, _EVENTS, (rep.replica_id, events))

    def start(rep: SimReplica, now: float) -> None:
        step = rep.schedule(now)
        flush(rep, now)
        if step is not None:
            push(step.end_s, _STEP_END, (rep, rep.version))

    def live() -> list[int]:
        return [rid for rid in born if rid not in gone]

    def leave_if_drained(rid: int, now: float) -> None:
        if rid in draining and replicas[rid].num_in_flight == 0:
            draining.discard(rid)
            kv.remove_replica(rid)
            gone[rid] = now
            timeline.append((now, len(live())))

    def tick(now: float) -> None:
        loads = kv.loads.loads
        rows = [{"id": rid, "in_flight": loads[rid].in_flight if rid in loads else 0,
                 "prefill_backlog": loads[rid].prefill_backlog if rid in loads else 0,
                 "draining": rid in draining} for rid in live()]
        decision = scaler.observe(now, rows)
        if decision is None:
            return
        if decision.action == "up":
            for _ in range(decision.target - decision.current):
                rep = SimReplica(len(replicas), blocks_per_replica, config, seed)
                replicas.append(rep)
                born[rep.replica_id] = now
                starting.add(rep.replica_id)
                push(now + startup_s, _JOIN, rep.replica_id)
            victim = None
        else:
            candidates = [r for r in rows if not r["draining"] and r["id"] not in starting]
            if not candidates:
                return
            exclusive = exclusive_blocks(kv)
            victim = cheapest_to_lose([{**r, "exclusive_blocks": exclusive.get(r["id"], 0)} for r in candidates])
            draining.add(victim)
            kv.set_healthy(victim, False)
            leave_if_drained(victim, now)
        decisions.append({**decision.as_dict(), "victim": victim})
        timeline.append((now, len(live())))

    i, n = 0, len(requests)
    push(autoscale.decision_interval_s, _TICK, None)
    while i < n or any(kind != _TICK for _, _, kind, _ in heap):
        if i < n and (not heap or requests[i].arrival_s <= heap[0][0]):
            req = requests[i]
            i += 1
            req.all_token_ids = tokens.prompt(req.hash_ids, req.num_prompt_tokens)
            rep = replicas[router.route(req)]
            rep.add(req)
            if rep.step is None:
                start(rep, req.arrival_s)
            else:
                new_end = rep.interrupt(req.arrival_s)
                if new_end is not None:
                    push(new_end, _STEP_END, (rep, rep.version))
            continue
        now, _, kind, payload = heapq.heappop(heap)
        if kind == _EVENTS:
            router.apply(*payload)
        elif kind == _TICK:
            tick(now)
            push(now + autoscale.decision_interval_s, _TICK, None)
        elif kind == _JOIN:
            starting.discard(payload)
            kv.add_replica(payload)  # healthy, with an empty tree: a cold replica
        else:
            rep, version = payload
            if version != rep.version:
                continue
            first, finished = rep.complete_step(now)
            router.on_first_tokens(rep.replica_id, first)
            router.on_finished(rep.replica_id, finished)
            flush(rep, now)
            start(rep, now)
            leave_if_drained(rep.replica_id, now)
    end = max(r.finished_s for r in requests)
    replica_s = sum(gone.get(rid, end) - t for rid, t in born.items())
    run = SimRun(policy, requests, replicas, router, time.perf_counter() - wall0, time.process_time() - cpu0)
    run.extra = {"replica_seconds": replica_s, "timeline": timeline, "decisions": decisions, "left": gone,
                 "max_live": max(count for _, count in timeline)}
    return run


def compare_with_fixed(requests_of, config: SimConfig, blocks_per_replica: int, tokens: BlockTokenCache,
                       autoscale: AutoscaleConfig, startup_s: float, policy: str = "cache_aware") -> dict:
    """Autoscaled vs a fixed fleet of ``max_replicas``: replica-seconds, TTFT p90, hit rate."""
    fixed = run_policy(policy, requests_of(), replace(config, num_replicas=autoscale.max_replicas),
                       blocks_per_replica, tokens)
    fixed_end = max(r.finished_s for r in fixed.requests)
    scaled = run_autoscaled(policy, requests_of(), config, blocks_per_replica, tokens, autoscale, startup_s)
    out = {}
    for name, run, replica_s in (("fixed_peak", fixed, autoscale.max_replicas * fixed_end),
                                 ("autoscaled", scaled, scaled.extra["replica_seconds"])):
        s = summarize(run)
        out[name] = {"replica_seconds": replica_s, "ttft_s": s["ttft_s"], "hit_rate": s["hit_rate"],
                     "queue_s": s["queue_s"], "num_requests": s["num_requests"], "cpu_s": run.cpu_s,
                     "wall_s": run.wall_s}
    out["autoscaled"].update(decisions=scaled.extra["decisions"], timeline=scaled.extra["timeline"],
                             max_live=scaled.extra["max_live"],
                             replicas_over_time=percentiles([c for _, c in scaled.extra["timeline"]]))
    return out


def main(argv: list[str] | None = None) -> int:
    from kvmesh.cluster.benchmarks.traces import read_mooncake
    from kvmesh.cluster.sim.replica import cut_trace, requests_from_mooncake
    from kvmesh.cluster.sim.run import blocks_per_replica

    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh sim scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="../shared/traces/mooncake_synthetic_trace.jsonl")
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--time-scale", type=float, default=1.0, help="arrival times x this (lower = faster)")
    ap.add_argument("--period", type=float, default=60.0, help="seconds of trace per slow and per fast phase")
    ap.add_argument("--slow-factor", type=float, default=4.0, help="slow phases run at 1/this of the rate")
    ap.add_argument("--min-replicas", type=int, default=1)
    ap.add_argument("--max-replicas", type=int, default=8)
    ap.add_argument("--target-in-flight", type=float, default=32.0)
    ap.add_argument("--target-prefill-tokens", type=int, default=0,
                    help="queued prefill tokens per replica to aim for (0 = in flight only)")
    ap.add_argument("--upscale-delay", type=float, default=5.0)
    ap.add_argument("--downscale-delay", type=float, default=30.0)
    ap.add_argument("--startup", type=float, default=30.0, help="seconds from a scale-up to the replica serving")
    ap.add_argument("--capacity-fraction", type=float, default=0.25)
    ap.add_argument("--out", default="results/sim_scaling.json")
    args = ap.parse_args(argv)
    records = cut_trace(read_mooncake(args.trace), 0, args.limit)
    config = SimConfig(num_replicas=args.max_replicas, capacity_fraction=args.capacity_fraction,
                       time_scale=args.time_scale)
    autoscale = AutoscaleConfig(scale_with_load=True, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                                target_in_flight=args.target_in_flight,
                                target_queued_prefill_tokens=args.target_prefill_tokens, upscale_delay_s=args.upscale_delay,
                                downscale_delay_s=args.downscale_delay)
    per_replica = blocks_per_replica(config, records)
    tokens = BlockTokenCache(config.block_size, config.vocab_size, config.seed)

    def requests_of():
        return vary_rate(requests_from_mooncake(records, config.time_scale, config.block_size),
                         args.period, args.slow_factor)

    report = {"args": vars(args), "blocks_per_replica": per_replica,
              **compare_with_fixed(requests_of, config, per_replica, tokens, autoscale, args.startup)}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    for name in ("fixed_peak", "autoscaled"):
        r = report[name]
        print(f"{name:11s} replica-s {r['replica_seconds']:9.0f}  TTFT p50 {r['ttft_s']['p50']:.3f}s "
              f"p90 {r['ttft_s']['p90']:.3f}s  hit rate {r['hit_rate']:.1%}  ({r['cpu_s']:.1f} CPU s)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
