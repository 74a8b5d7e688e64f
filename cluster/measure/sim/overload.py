"""Admission on and off at 1x, 2x and 4x the fleet's capacity, in the simulator (the
criterion: at 4x, goodput with admission >= 2x goodput without).
``python -m kvmesh.cluster.measure.sim.overload``.

1. Capacity: the workload's requests all at once on the fleet (admission off): the fleet's throughput in
   requests per second when it is never idle (``capacity_rps``).
2. For each load factor k: the workload's arrivals scaled to k x that rate, run twice side by side on the same
   requests: *off* (today's kvmesh: every request goes on to a replica, replicas in arrival order) and *on* (the
   router's admission, router/admission/ driven in simulated time by sim/admission.py, and the replicas'
   ``--scheduling-policy priority``).

Every request carries its tenant's priority and targets (workloads/tenants.py, preset ``overload``: a tenant
flooding with 70% of the requests, two light tenants, a high-priority class); goodput is the requests that met
both targets per second of arrivals (sim/goodput.py). Writes the JSON report and a PNG (overload_plot.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from kvmesh.cluster.measure.sim.config import SimConfig, miniature, sim_engine
from kvmesh.cluster.measure.sim.run import compare_policies
from kvmesh.cluster.measure.workloads.registry import get_workload
from kvmesh.cluster.measure.workloads.settings import WorkloadSettings
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord

LEVELS = (1.0, 2.0, 4.0)


def arrival_rps(records: list[MooncakeRecord]) -> float:
    """The records' own request rate (first to last arrival)."""
    span = (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000.0
    return len(records) / span if span > 0 else float("inf")


def capacity_rps(records: list[MooncakeRecord], config: SimConfig, policy: str) -> float:
    """Requests per second the fleet completes with every request queued at once (admission off)."""
    burst = replace(config, time_scale=1e-9, admission=False)
    s = compare_policies(records, burst, [policy], show_progress=False, with_ceilings=False)["policies"][policy]
    return s["num_requests"] / s["makespan_s"]


def overload_variants(config: SimConfig, levels: tuple[float, ...], capacity: float,
                      offered: float) -> dict[str, dict]:
    """Label suffix -> ``SimConfig`` changes: for each level, off then on (interleaved: a noisy machine)."""
    fcfs = replace(config.engine, scheduling_policy="fcfs")
    prio = replace(config.engine, scheduling_policy="priority")
    out = {}
    for k in levels:
        scale = offered / (k * capacity)  # arrival times x scale: the rate becomes k x capacity
        out[f"/{k:g}x/off"] = {"time_scale": scale, "admission": False, "engine": fcfs}
        out[f"/{k:g}x/on"] = {"time_scale": scale, "admission": True, "engine": prio}
    return out


def run_overload(records: list[MooncakeRecord], config: SimConfig, policy: str = "cache_aware",
                 levels: tuple[float, ...] = LEVELS, show_progress: bool = False) -> dict:
    """The comparison's JSON-ready report: the capacity, then per level and side the goodput summary."""
    capacity = capacity_rps(records, config, policy)
    offered = arrival_rps(records)
    report = compare_policies(records, config, [policy], show_progress=show_progress, with_ceilings=False,
                              variants=overload_variants(config, levels, capacity, offered))
    rows = []
    for k in levels:
        row: dict = {"load": k, "offered_rps": k * capacity}
        for side in ("off", "on"):
            s = report["policies"][f"{policy}/{k:g}x/{side}"]
            row[side] = {"goodput": s["goodput"], "hit_rate": s["hit_rate"], "cpu_s": s["cpu_s"],
                         "wall_s": s["wall_s"]}
        off, on = row["off"]["goodput"]["goodput_rps"], row["on"]["goodput"]["goodput_rps"]
        row["goodput_ratio"] = on / off if off > 0 else float("inf")
        rows.append(row)
    return {"policy": policy, "capacity_rps": capacity, "workload_rps": offered, "levels": rows,
            "config": report["config"], "runs": report["policies"]}


def format_overload(result: dict) -> str:
    lines = [f"fleet capacity {result['capacity_rps']:.2f} req/s ({result['policy']}); goodput = requests meeting "
             "their TTFT and TPOT targets per second of arrivals",
             f"{'load':>5}{'side':>5}{'good/s':>9}{'good':>7}{'shed':>7}  TTFT p50 / p99 per priority"]
    for row in result["levels"]:
        for side in ("off", "on"):
            g = row[side]["goodput"]
            ttft = "  ".join(f"{p}: {v['ttft_s']['p50']:.2f}/{v['ttft_s']['p99']:.2f}"
                             for p, v in g["per_priority"].items())
            lines.append(f"{row['load']:>4g}x{side:>5}{g['goodput_rps']:>9.2f}{g['good_rate']:>7.0%}"
                         f"{g['shed_rate']:>7.0%}  {ttft}")
        lines.append(f"{'':>10}goodput on/off: {row['goodput_ratio']:.2f}x")
    return "\n".join(lines)


def _levels(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated load factors, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected load factors > 0, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="python -m kvmesh.cluster.measure.sim.overload",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="chatbot", help="a registered workload (default: %(default)s)")
    ap.add_argument("--num-requests", type=int, default=3000, help="requests of the workload (default: %(default)s)")
    ap.add_argument("--prompt-tokens", type=int, default=4096, help="generated prompt size (default: %(default)s)")
    ap.add_argument("--output-tokens", type=int, default=200, help="tokens per answer (default: %(default)s)")
    ap.add_argument("--num-replicas", type=int, default=4, help="simulated replicas (default: %(default)s)")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="a replica's batch (default: %(default)s)")
    ap.add_argument("--tenants", default="overload", help="tenant mix (workloads/tenants.py; default: %(default)s)")
    ap.add_argument("--policy", default="cache_aware", help="routing policy (default: %(default)s)")
    ap.add_argument("--levels", type=_levels, default=LEVELS, help="load factors (default: 1,2,4)")
    ap.add_argument("--miniature", type=int, default=8, help="token counts / this, same model time (default: 8)")
    ap.add_argument("--admission-pricing", choices=("queue", "slots"), default="queue",
                    help="how admission prices its head (SimConfig.admission_pricing; default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/sim_overload.json", help="JSON path (a PNG beside it)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    try:
        settings = WorkloadSettings(num_requests=args.num_requests, prompt_tokens=args.prompt_tokens,
                                    output_tokens=args.output_tokens, seed=args.seed)
        records = get_workload(args.workload).make(settings)
        engine = replace(sim_engine(), max_num_seqs=args.max_num_seqs)
        config = miniature(SimConfig(num_replicas=args.num_replicas, engine=engine, tenants=args.tenants,
                                     admission_pricing=args.admission_pricing, seed=args.seed), args.miniature)
        result = run_overload(records, config, args.policy, args.levels)
    except ValueError as e:
        print(f"overload: {e}", file=sys.stderr)
        return 2
    result["command"] = " ".join(["python -m kvmesh.cluster.measure.sim.overload", *(argv or sys.argv[1:])])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    written = [str(out)]
    if not args.no_plot:
        from kvmesh.cluster.measure.sim.overload_plot import plot_overload

        written.append(str(plot_overload(result, out.with_suffix(".png"))))
    print(format_overload(result))
    print("wrote " + " and ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
