"""Emulated fleet against the simulator: the same trace requests (Mooncake's, or another trace workload's) through
kvmesh's router in front of N emulated replicas (``kvmesh replica --emulate``, one process) and through ``kvmesh
sim``; cached prompt share and mean TTFT side by side, and the emulator's own lateness (planned step end against
actual, p50/p99).

    kvmesh bench emulated_fleet                     # results/emulated_fleet.json: 16 replicas, the first 200 requests,
    4x
    kvmesh bench emulated_fleet --workload azure_code --speedup 3 --out results/emulated_fleet_azure_code.json
    kvmesh bench emulated_fleet --replicas 4 --num-requests 60 --dilation 2 --out /tmp/emulated_fleet.json

Both sides get the same requests: the workload's first records (``kvmesh bench load``'s), prompts cut to
``--max-prompt-tokens`` (16 tokens per hash id) and outputs to ``--max-tokens``. The simulator runs its miniature of
them (16-token blocks, per-token costs x32: model time is the full trace's), the same routing policy, blocks per
replica and step budgets; the live replicas wait out that same cost model, written as a profile file, times
``--dilation``. The load is sent at the trace's timestamps times the dilation (divided by ``--speedup``), and its
TTFTs are divided by it (a slower fleet keeps the machine's own lateness a smaller share of each step).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.emulated_fleet_live import LiveSettings, run_live
from kvmesh.router.routing.receipts import HEADER_REPLICA


def simulate(args: argparse.Namespace, work: Path, replica_of: dict[str, str] | None = None) -> dict:
    """``kvmesh sim``'s run on the same requests, in its own process (sim/emulated_check.py writes it); with
    ``replica_of`` (request id -> the live run's replica) every request placed where the live router put it."""
    out = work / ("sim.json" if replica_of is None else "sim_live_placements.json")
    placed = []
    if replica_of is not None:
        (work / "placements.json").write_text(json.dumps(replica_of))
        placed = ["--placements", str(work / "placements.json")]
    subprocess.run([sys.executable, "-m", "kvmesh.cluster.measure.sim.emulated_check", "--replicas", str(args.replicas),
                    "--workload", args.workload, "--speedup", f"{args.speedup:g}",
                    "--num-requests", str(args.num_requests), "--max-prompt-tokens", str(args.max_prompt_tokens),
                    "--max-tokens", str(args.max_tokens), "--policy", args.policy, "--seed", str(args.seed),
                    "--capacity-fraction", f"{args.capacity_fraction:g}",
                    "--predict-hold-s", f"{args.predict_hold_s:g}", *placed, "--out", str(out)], check=True)
    return json.loads(out.read_text())


def live_placements(live: dict) -> dict[str, str]:
    """Request id -> the replica the live router sent it to (its route receipt)."""
    return {rid: receipt[HEADER_REPLICA] for rid, receipt in live["receipt_by_request"].items()}


def compare(sim: dict, live: dict, dilation: float, replayed: dict) -> dict:
    """Hit share in points and mean TTFT in percent, the live TTFT undilated; lateness against the mean TTFT; the
    requests the two routers placed apart (their cached tokens differ); and the live run against the simulator given
    the live placements (``replayed``): what the replicas' timing leaves once the routers' choices are the same."""
    live_ttft = live["ttft_s"]["mean"] / dilation
    sim_ttft = sim["ttft_s"]["mean"]
    late_p99 = max(r["late_s_p99"] for r in live["replicas"])
    diffs = sorted(live["ttft_by_request"][rid] / dilation - sim_s for rid, sim_s in sim["ttft_by_request"].items())
    return {"cached_share_points": 100 * (live["cached_share"] - sim["cached_share"]),
            "ttft_mean_percent": 100 * (live_ttft / sim_ttft - 1),
            "live_ttft_mean_s": live_ttft, "sim_ttft_mean_s": sim_ttft,
            "late_s_p99_worst_replica": late_p99,
            "late_p99_share_of_live_ttft": late_p99 / live["ttft_s"]["mean"],
            "per_request_ttft_diff_s": {"p50": diffs[len(diffs) // 2], "mean": sum(diffs) / len(diffs),
                                        "off_by_over_100ms": sum(abs(d) > 0.1 for d in diffs)},
            "placed_apart": sum(live["cached_by_request"][rid] != cached for rid, cached in
                                sim["cached_by_request"].items()),
            "live_placements": {"sim_cached_share": replayed["cached_share"],
                                "sim_ttft_mean_s": replayed["ttft_s"]["mean"],
                                "cached_share_points": 100 * (live["cached_share"] - replayed["cached_share"]),
                                "ttft_mean_percent": 100 * (live_ttft / replayed["ttft_s"]["mean"] - 1)},
            "within": {"cached_share_1_point": abs(live["cached_share"] - sim["cached_share"]) <= 0.01,
                       "ttft_mean_5_percent": abs(live_ttft / sim_ttft - 1) <= 0.05}}


def cpu_cell(live: dict) -> str:
    """The fleet's and the router's CPU seconds over the replay's wall seconds (as cores), and the range of the
    replicas' engine CPU per step."""
    per_step = [r["cpu_s_per_step"] for r in live["replicas"]]
    cpu, wall = live["fleet_and_router_cpu_s"], live["duration_s"]
    return (f"{cpu:.0f} s in {wall:.0f} s ({cpu / wall:.2f} cores); "
            f"{1000 * min(per_step):.2f}-{1000 * max(per_step):.2f} ms")


def table(results: list[dict]) -> str:
    """A row per results file: the workload, the simulator's and the fleet's cached share and mean TTFT (the fleet's
    as a difference, with whether it is within the margins: 1 point, 5%), the per-request agreement and the fleet's
    own lateness."""
    lines = ["| workload | cached: simulator / fleet | mean TTFT: simulator / fleet | per-request TTFT difference, "
             "median | requests off by over 100 ms | requests placed apart | the live placements in the simulator: "
             "cached, mean TTFT (the fleet's against it) | "
             "step lateness p99, worst replica, live (share of the live mean TTFT) | CPU: the fleet and the router "
             "over the replay; per engine step |",
             "|---" * 9 + "|"]
    for r in results:
        c, s = r["comparison"], r["settings"]
        within, lp = c["within"], c["live_placements"]
        speed = f" x{s['speedup']:g}" if s.get("speedup", 1) != 1 else ""
        hold = f", predictions held ({s['predict_hold_s']:g} s)" if s.get("predict_hold_s") else ""
        lines.append(
            f"| {s.get('workload', 'mooncake')}{speed}, first {s['num_requests']}{hold} | "
            f"{100 * r['sim']['cached_share']:.2f}% / {100 * r['live']['cached_share']:.2f}% "
            f"({c['cached_share_points']:+.2f} pt{'' if within['cached_share_1_point'] else ', outside 1 pt'}) | "
            f"{c['sim_ttft_mean_s']:.3f} s / {c['live_ttft_mean_s']:.3f} s "
            f"({c['ttft_mean_percent']:+.1f}%{'' if within['ttft_mean_5_percent'] else ', outside 5%'}) | "
            f"{1000 * c['per_request_ttft_diff_s']['p50']:+.0f} ms | "
            f"{c['per_request_ttft_diff_s']['off_by_over_100ms']} of {s['num_requests']} | "
            f"{c['placed_apart']} of {s['num_requests']} | "
            f"{100 * lp['sim_cached_share']:.2f}%, {lp['sim_ttft_mean_s']:.3f} s ({lp['ttft_mean_percent']:+.1f}%) | "
            f"{1000 * c['late_s_p99_worst_replica']:.0f} ms ({100 * c['late_p99_share_of_live_ttft']:.2f}%) | "
            f"{cpu_cell(r['live'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvmesh bench emulated_fleet", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--workload", default="mooncake",
                    help="a trace workload (kvmesh bench load's), replayed at its records' times: mooncake, azure_code")
    ap.add_argument("--speedup", type=float, default=1.0,
                    help="send the records this many times as fast as their times say (in the GPU's time)")
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024, help="16 tokens per trace block (512 trace tokens)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dilation", type=float, default=4.0, help="every step and every arrival gap this many times")
    ap.add_argument("--policy", default="cache_aware_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--capacity-fraction", type=float, default=1.0,
                    help="the fleet's KV blocks as a share of the requests' distinct blocks (the simulator admits a "
                         "request only with room for its whole output, the engine allocates as it goes: with room "
                         "to spare they schedule alike)")
    ap.add_argument("--predict-hold-s", type=float, default=0.0,
                    help="the router's predict_hold_s in the GPU's time, live and in the simulator (0: off)")
    ap.add_argument("--out", default="results/emulated_fleet.json")
    ap.add_argument("--work", default=None, help="keep the profile, the logs and the load's per-request file here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        sim = simulate(args, work)
        print(f"[emulated_fleet] sim: cached {sim['cached_share']:.3f}, TTFT mean {sim['ttft_s']['mean']:.3f} s",
              flush=True)
        settings = LiveSettings(args.replicas, args.num_requests, args.max_prompt_tokens, args.max_tokens,
                                args.dilation, args.policy, work, args.workload, args.speedup, args.predict_hold_s)
        live = run_live(settings, sim)
        replayed = simulate(args, work, live_placements(live))
    result = {"bench": "emulated_fleet", "command": "kvmesh bench emulated_fleet " + " ".join(argv or sys.argv[3:]),
              "settings": vars(args), "sim": sim, "sim_live_placements": replayed,
              "live": live, "comparison": compare(sim, live, args.dilation, replayed),
              "wall_s": time.monotonic() - t0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    c = result["comparison"]
    print(f"[emulated_fleet] live: cached {live['cached_share']:.3f} ({c['cached_share_points']:+.2f} points), TTFT "
          f"mean {c['live_ttft_mean_s']:.3f} s ({c['ttft_mean_percent']:+.1f}%), lateness p99 "
          f"{1000 * c['late_s_p99_worst_replica']:.2f} ms; wrote {args.out}", flush=True)
    return 0

