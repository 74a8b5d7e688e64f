"""The router's live single-pool ceiling on whole traces: ``kvmesh sim``'s routers (the real ``KVRouter``) estimate
it from the requests they route (router/routing/ceiling.py); beside it the simulator's own single pool (one real
``KVCacheManager`` of the same blocks), and the CPU the estimate's replay takes per request against the routing's.

    kvmesh bench live_ceiling                          # results/live_ceiling.json: mooncake and azure_conv, 16
    replicas, 2x
    kvmesh bench live_ceiling --workloads mooncake --replicas 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def measure(workload: str, replicas: int, time_scale: float, policy: str) -> dict:
    """One ``kvmesh sim`` run of ``policy`` over the whole ``workload``: both ceilings and the replay's CPU."""
    args = ["sim", "--workload", workload, "--num-replicas", str(replicas), "--time-scale", f"{time_scale:g}",
            "--policies", policy, "--no-plot", "--no-progress"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        subprocess.run([sys.executable, "-m", "kvmesh.cluster.cli", *args, "--out", str(out)], check=True,
                       stdout=subprocess.DEVNULL)
        report = json.loads(out.read_text())
    run = report["policies"][policy]
    live = run["live_ceiling"]
    return {"command": "kvmesh " + " ".join(args), "requests": live["requests"], "total_blocks": report["total_blocks"],
            "live_ceiling_hit_rate": live["ceiling_hit_rate"],
            "sim_single_pool_hit_rate": report["ceilings"]["single_pool_hit_rate"],
            "live_share_of_ceiling": live["share_of_ceiling"],
            "sim_hit_rate_vs_single_pool": run["hit_rate_vs_single_pool"],
            "miss_tokens": live["miss_tokens"], "replay_us_per_request": live["replay_us_per_request"],
            "route_us_per_request": 1000 * run["route_ms_per_request"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvmesh bench live_ceiling", description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="mooncake,azure_conv")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--policy", default="cache_aware_tokens")
    ap.add_argument("--out", default="results/live_ceiling.json")
    args = ap.parse_args(argv)
    runs = {w: measure(w, args.replicas, args.time_scale, args.policy) for w in args.workloads.split(",")}
    for w, r in runs.items():
        print(f"{w}: live ceiling {r['live_ceiling_hit_rate']:.2%}, sim single pool "
              f"{r['sim_single_pool_hit_rate']:.2%}; replay {r['replay_us_per_request']:.0f} us per request "
              f"(routing {r['route_us_per_request']:.0f} us)")
    Path(args.out).write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
