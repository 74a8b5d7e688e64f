"""kvmesh's router against the routers users would run instead, live, on a fleet of emulated GPU replicas: N
replicas (``kvmesh replica --emulate``, one process) with the simulator's H100 8B timing, and in front of them, in
turn, kvmesh's router at its default policy, vllm-router (``cache_aware``, ``kv_aware`` on the replicas' event and
replay sockets, ``round_robin``) and sglang-router (``cache_aware``), each at its CLI defaults from its own
virtualenv (``--peers-dir``), in paired rounds of alternating order on reset caches (``kvmesh bench compare-policies
--router``, loadgen/live_compare.py).

    kvmesh bench live_verdict --workload chatbot --rate 3 --out results/live_verdict_chatbot_1x.json
    kvmesh bench live_verdict --replicas 4 --num-requests 24 --rounds 1 --routers kvmesh,sglang-router \
        --out /tmp/lv.json

The replicas run the simulator's miniature of the 8B model on H100s (``kvmesh sim``'s, sim/config.py ``miniature``):
16-token blocks, per-token costs x32, so a 1,024-token prompt here costs what a 32k-token prompt costs an H100 and a
decode step stays one. Every step waits ``--dilation`` times its profile time, so the machine's own lateness (a
sleep that wakes late, host work) stays a small share of each step; the load is sent at ``--rate`` in the dilated
fleet's time, and TTFTs are reported as measured (divide by the dilation for the GPU's). Prompts are text (the
peers match text). The results file is compare-policies' with the fleet's settings and every replica's own timing
(``/load``'s ``emulation``: step lateness p50/p99, CPU per step) added.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.workloads.settings import MINIATURE

DEFAULT_ROUTERS = "kvmesh,vllm-router,vllm-router:kv_aware,vllm-router:round_robin,sglang-router"


def fleet_sizes(args: argparse.Namespace, work: Path) -> dict:
    """The replicas' profile and budgets: the simulator's miniature of its default fleet (sim/emulated_check.py
    writes it, in its own process, as ``kvmesh bench emulated_fleet`` has it)."""
    out = work / "sim.json"
    subprocess.run([sys.executable, "-m", "kvmesh.cluster.measure.sim.emulated_check", "--replicas", str(args.replicas),
                    "--num-requests", "1", "--out", str(out)], check=True)
    return json.loads(out.read_text()) | {"blocks_per_replica": args.num_kv_blocks}


def compare_argv(args: argparse.Namespace, ends: list[dict]) -> list[str]:
    """``kvmesh bench compare-policies``' arguments for the routers in front of the fleet ``ends``."""
    from kvmesh.cluster.measure.shared_dir import stories_model

    argv = [a for e in ends for a in ("--replica", f"{e['http_url']},events={e['events_endpoint']},"
                                                   f"replay={e['replay_endpoint']}")]
    for name in args.routers.split(","):
        argv += ["--router", name]
    return argv + ["--router-model", str(stories_model()), "--workloads", args.workload,
                   "--num-prefixes", str(args.num_prefixes), "--num-requests", str(args.num_requests),
                   "--max-prompt-tokens", str(args.max_prompt_tokens), "--max-tokens", str(args.max_tokens),
                   "--mode", "open", "--rate", f"{args.rate:g}", "--prompt-format", "text", "--seed", str(args.seed),
                   "--rounds", str(args.rounds), "--no-progress", "--out", args.out,
                   *(["--peers-dir", args.peers_dir] if args.peers_dir else []),
                   *(["--no-plot"] if args.no_plot else [])]


def main(argv: list[str] | None = None) -> int:
    from kvmesh.cluster.measure.benchmarks.support.emulated_fleet_live import (
        LiveSettings,
        replica_timing,
        start_fleet,
    )
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_table import table
    from kvmesh.cluster.measure.loadgen.compare import main as compare_main
    from kvmesh.cluster.measure.loadgen.processes import stop_processes

    ap = argparse.ArgumentParser(prog="kvmesh bench live_verdict", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--workload", default="chatbot", help="a registered workload (kvmesh bench load's)")
    ap.add_argument("--num-prefixes", type=int, default=8, help="chatbot, multi_turn: tenants")
    ap.add_argument("--num-requests", type=int, default=240)
    ap.add_argument("--rate", type=float, default=3.0, help="sessions/s sent, in the dilated fleet's time")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-kv-blocks", type=int, default=512, help="KV blocks per replica (16 tokens each)")
    ap.add_argument("--dilation", type=float, default=4.0, help="every step takes this many times its profile time")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--routers", default=DEFAULT_ROUTERS,
                    help=f"the arms, comma-separated (default: {DEFAULT_ROUTERS}; kvmesh:POLICY@K=V: kvmesh's router "
                         "at a policy with a knob set; kvmesh:POLICY@--flag=V: with one of its flags)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peers-dir", default=None, help="the peers' virtualenvs (default: ../peers)")
    ap.add_argument("--work", default=None, help="a folder for the profile and the fleet's log (default: a temporary)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--out", default="results/live_verdict.json")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="kvmesh-live-verdict-"))
    work.mkdir(parents=True, exist_ok=True)
    settings = LiveSettings(replicas=args.replicas, num_requests=args.num_requests,
                            max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens,
                            dilation=args.dilation, policy="", work=work)
    procs: list[subprocess.Popen] = []
    try:
        t0 = time.monotonic()
        sizes = fleet_sizes(args, work)
        ends = start_fleet(settings, sizes, procs)
        print(f"[live_verdict] {len(ends)} emulated replicas up in {time.monotonic() - t0:.0f} s", flush=True)
        rc = compare_main(compare_argv(args, ends))
        timing = replica_timing(ends)
    finally:
        stop_processes(procs, 30)
    out = Path(args.out)
    if not out.exists():
        return rc or 1
    result = json.loads(out.read_text())
    result["command"] = "kvmesh bench live_verdict " + " ".join(argv if argv is not None else sys.argv[3:])
    result["fleet"] = {"replicas": args.replicas, "dilation": args.dilation, "miniature": MINIATURE,
                       "num_kv_blocks": args.num_kv_blocks, "rate": args.rate, "emulation": timing,
                       "cost": sizes["cost"], "max_num_batched_tokens": sizes["max_num_batched_tokens"]}
    out.write_text(json.dumps(result, indent=1))
    print(table([result]), flush=True)
    late = max(r["late_s_p99"] for r in timing)
    print(f"[live_verdict] step lateness p99 (worst replica) {1000 * late:.1f} ms; wrote {out}", flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
