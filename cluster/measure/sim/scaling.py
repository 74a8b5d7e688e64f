"""Replicas joining and leaving over a trace: the live autoscaler's policy, in simulated time.

``AutoscaledFleet`` is a fleet policy of the simulator's one loop (``loop.run_policy``), with two
kinds of events of its own:

- tick (every ``autoscale.decision_interval_s``): the replicas' rows as ``GET /replicas`` gives them (the
  router's in-flight counts and prefill backlog) go to ``cluster.autoscaler.Autoscaler``; "up"
  creates replicas that join the router ``startup_s`` later (a cold cache), "down" drains the
  replica ``cheapest_to_lose`` picks from the index's exclusive blocks (``router/routing/retention.py``);
- join: a started replica joins the router; a drained replica with nothing in flight leaves (the
  router drops it and its replica-seconds stop).

``vary_rate`` turns a trace into one whose rate alternates between slow and fast phases, and
``compare_with_fixed`` runs it autoscaled and on a fixed fleet sized for the peak (``max_replicas``):
replica-seconds and TTFT p90 side by side. ``kvmesh sim scaling`` (``python -m kvmesh.cluster.measure.sim.scaling``)
writes that report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace

from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.cluster.fleet.autoscaler import Autoscaler, cheapest_to_lose
from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.event_kinds import FLEET_EVENT, FLEET_TIMER, Payload
from kvmesh.cluster.measure.sim.loop import Simulation, run_policy
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.cluster.measure.sim.report import summarize
from kvmesh.cluster.measure.sim.sim_run import SimRun
from kvmesh.cluster.measure.sim.stats import percentiles
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.router.routing.retention import exclusive_blocks


def vary_rate(requests: list[SimRequest], period_s: float, slow_factor: float) -> list[SimRequest]:
    """Arrival times warped so the rate alternates: ``period_s`` of trace time at 1/``slow_factor``
    of its rate, then ``period_s`` at its own rate, and so on (the requests are changed in place)."""
    for req in requests:
        t = req.arrival_s
        whole, part = divmod(t, 2 * period_s)
        slow_part = min(part, period_s)
        req.arrival_s = whole * period_s * (slow_factor + 1) + slow_part * slow_factor + max(0.0, part - period_s)
    return sorted(requests, key=lambda r: r.arrival_s)


class AutoscaledFleet:
    """``autoscale.min_replicas`` replicas to start, then the autoscaler deciding (see the module doc)."""

    def __init__(self, autoscale: AutoscaleConfig, startup_s: float) -> None:
        self.autoscale = autoscale
        self.startup_s = startup_s
        self.scaler = Autoscaler(autoscale)
        self.born: dict[str, float] = {}   # replica -> when it was asked for
        self.gone: dict[str, float] = {}   # replica -> when it left
        self.starting: set[str] = set()
        self.draining: set[str] = set()
        self.timeline: list[tuple[float, int]] = []
        self.decisions: list[dict] = []

    def initial_replicas(self, config: SimConfig) -> int:
        return self.autoscale.min_replicas

    def begin(self, sim: Simulation) -> None:
        self.born = {rep.replica_id: 0.0 for rep in sim.replicas}
        self.timeline.append((0.0, len(sim.replicas)))
        sim.push(self.autoscale.decision_interval_s, FLEET_TIMER, None)

    def live(self) -> list[str]:
        return [rid for rid in self.born if rid not in self.gone]

    def on_event(self, sim: Simulation, now: float, kind: int, payload: Payload) -> None:
        if kind == FLEET_EVENT:  # a started replica joins: healthy, with an empty tree (a cold cache)
            assert isinstance(payload, str)
            self.starting.discard(payload)
            sim.router.add_replica(payload, sim.by_id[payload].num_blocks + 1)
            return
        self.tick(sim, now)
        sim.push(now + self.autoscale.decision_interval_s, FLEET_TIMER, None)

    def after_step(self, sim: Simulation, rep: SimReplica, now: float) -> None:
        self.leave_if_drained(sim, rep.replica_id, now)

    def leave_if_drained(self, sim: Simulation, rid: str, now: float) -> None:
        if rid in self.draining and sim.by_id[rid].num_in_flight == 0:
            self.draining.discard(rid)
            sim.router.remove_replica(rid)
            self.gone[rid] = now
            self.timeline.append((now, len(self.live())))

    def tick(self, sim: Simulation, now: float) -> None:
        kv = sim.router.router
        loads = kv.loads.loads
        rows = [{"id": rid, "in_flight": loads[rid].in_flight if rid in loads else 0,
                 "prefill_backlog": loads[rid].prefill_backlog if rid in loads else 0,
                 "draining": rid in self.draining} for rid in self.live()]
        waiting = 0 if sim.admission is None else sim.admission.num_waiting
        decision = self.scaler.observe(now, rows, waiting=waiting)
        if decision is None:
            return
        victim = None
        if decision.action == "up":
            for _ in range(decision.target - decision.current):
                rep = sim.new_replica()
                self.born[rep.replica_id] = now
                self.starting.add(rep.replica_id)
                sim.push(now + self.startup_s, FLEET_EVENT, rep.replica_id)
        else:
            candidates = [r for r in rows if not r["draining"] and r["id"] not in self.starting]
            if not candidates:
                return
            exclusive = exclusive_blocks(kv)
            victim = cheapest_to_lose([{**r, "exclusive_blocks": exclusive.get(r["id"], 0)} for r in candidates])
            self.draining.add(victim)
            sim.router.set_healthy(victim, False)
            self.leave_if_drained(sim, victim, now)
        self.decisions.append({**decision.as_dict(), "victim": victim})
        self.timeline.append((now, len(self.live())))

    def extra(self, sim: Simulation) -> dict:
        end = max(r.finished_s for r in sim.requests)
        replica_s = sum(self.gone.get(rid, end) - t for rid, t in self.born.items())
        return {"replica_seconds": replica_s, "timeline": self.timeline, "decisions": self.decisions,
                "left": self.gone, "max_live": max(count for _, count in self.timeline)}


def run_autoscaled(policy: str, requests: list[SimRequest], config: SimConfig, blocks_per_replica: int,
                   tokens: BlockTokenCache, autoscale: AutoscaleConfig, startup_s: float) -> SimRun:
    """``run_policy`` on an ``AutoscaledFleet``."""
    return run_policy(policy, requests, config, blocks_per_replica, tokens,
                      fleet=AutoscaledFleet(autoscale, startup_s))


def compare_with_fixed(requests_of: Callable[[], list[SimRequest]], config: SimConfig, blocks_per_replica: int,
                       tokens: BlockTokenCache,
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
    from kvmesh.cluster.config.flags import ConfigError, add_config_arguments, config_from_args
    from kvmesh.cluster.config.schema import to_dict
    from kvmesh.cluster.measure.sim.options import SCALING_SCHEMA, ScalingCommandConfig
    from kvmesh.cluster.measure.sim.replica import cut_trace, requests_from_mooncake
    from kvmesh.cluster.measure.sim.run import blocks_per_replica
    from kvmesh.cluster.measure.workloads.traces import TraceError, read_mooncake

    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh sim scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(ap, SCALING_SCHEMA, config_file=False)
    ap.add_argument("--out", default="results/sim_scaling.json", help="JSON report path (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        command: ScalingCommandConfig = config_from_args(args, SCALING_SCHEMA)
        s, autoscale = command.scaling, command.autoscale
        records = cut_trace(read_mooncake(s.trace), 0, s.limit)
    except (ConfigError, TraceError) as e:
        print(f"kvmesh sim scaling: {e}", file=sys.stderr)
        return 2
    config = command.sim
    per_replica = blocks_per_replica(config, records)
    tokens = BlockTokenCache(config.engine.block_size, config.vocab_size, config.seed)

    def requests_of() -> list[SimRequest]:
        return vary_rate(requests_from_mooncake(records, config.time_scale, config.engine.block_size), s.period,
                         s.slow_factor)

    try:
        runs = compare_with_fixed(requests_of, config, per_replica, tokens, autoscale, s.startup, s.policy)
    except ValueError as e:  # e.g. a request larger than a replica's pool at this cut's capacity
        print(f"kvmesh sim scaling: {e}", file=sys.stderr)
        return 2
    report = {"args": to_dict(command) | {"out": args.out}, "blocks_per_replica": per_replica, **runs}
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
