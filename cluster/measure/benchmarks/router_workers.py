"""Router CPU per request: ``--workers 1`` vs ``--workers 2``, interleaved, and what core sharing costs.

    kvmesh bench router-workers [--rounds 4] [--duration 4] [--out results/router_workers.json]

One instant stub replica and wrk (64 keep-alive clients) on core 1; each router's process tree alone
on core 0 (as ``kvmesh bench router-peers`` runs them). Variants, interleaved per round:

    1-worker        kvmesh router
    2-workers       kvmesh router --workers 2 (both processes on core 0; shared in-flight counts)
    1-worker+hog    the same 1-worker router while a busy Python loop (not counted) also runs on
                    core 0: what sharing a core costs a router process by itself

Per variant: the router tree's CPU (/proc) per request and context switches per request, at
saturation, on the ``token_ids`` workload of router_peers (no tokenization: the router's own path).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.peer_load import (
    free_port,
    pinned,
    run_wrk,
    shutil,
    start_stub_replicas,
    tree_cpu_seconds,
    wait_http,
)

ROOT = Path(__file__).resolve().parents[3]
STORIES = ROOT.parent / "shared" / "models" / "stories260K" / "hf"


def _context_switches(pid: int) -> int:
    total = 0
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for p in [pid, *map(int, kids)]:
        try:
            with open(f"/proc/{p}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:
            pass
    return total


def main(argv: list[str] | None = None) -> int:
    from kvmesh.cluster.measure.benchmarks.router_peers import PATHS, workloads
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench router-workers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/router_workers.json")
    ap.add_argument("--model", default=str(STORIES))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of saturation per measurement")
    args = ap.parse_args(argv)
    if shutil.which("wrk") is None:
        print("kvmesh bench router-workers: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    bodies = workloads(load_tokenizer(args.model, max_model_len=8192))["token_ids"]
    path = PATHS["token_ids"]
    if hasattr(os, "sched_setaffinity") and os.cpu_count() > 1:
        os.sched_setaffinity(0, {1})
    procs = []
    rows = []
    try:
        stub = start_stub_replicas(procs, 1)[0]
        routers = {}
        for name, workers in (("1-worker", 1), ("2-workers", 2)):
            port = free_port()
            cmd = [sys.executable, "-m", "kvmesh.cluster.cli", "router", "--model", args.model, "--max-model-len",
                   "8192", "--log-level", "warning", "--host", "127.0.0.1", "--replica", stub, "--port", str(port),
                   "--workers", str(workers)]
            procs.append(subprocess.Popen(pinned(cmd, 0), stderr=subprocess.DEVNULL))
            routers[name] = (procs[-1], f"http://127.0.0.1:{port}")
        for proc, url in routers.values():
            wait_http(url, proc=proc)
        time.sleep(5)  # workers finish starting (each its own tokenizer and event feed)
        variants = [*routers.items(), ("1-worker+hog", routers["1-worker"])]
        for rnd in range(args.rounds):
            for name, (proc, url) in variants:
                hog = (subprocess.Popen(pinned([sys.executable, "-c", "while True: pass"], 0))
                       if name.endswith("+hog") else None)
                try:
                    run_wrk(url, path, bodies, 64, 1, cpu=1)  # warm
                    cpu0, ctx0 = tree_cpu_seconds(proc.pid), _context_switches(proc.pid)
                    sat = run_wrk(url, path, bodies, 64, args.duration, cpu=1)
                    cpu, ctx = tree_cpu_seconds(proc.pid) - cpu0, _context_switches(proc.pid) - ctx0
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
                n = max(sat["requests"], 1)
                row = {"round": rnd, "variant": name, "cpu_ms_per_request": 1e3 * cpu / n,
                       "context_switches_per_request": ctx / n, "requests_per_s": n / sat["duration_s"],
                       "errors": sat["socket_errors"] + sat["status_errors"]}
                rows.append(row)
                print(f"  round {rnd} {name:<13} {row['cpu_ms_per_request']:.3f} ms CPU/req  "
                      f"{row['context_switches_per_request']:.2f} ctx sw/req  {row['requests_per_s']:.0f} req/s  "
                      f"errors {row['errors']}", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    summary = {name: {key: statistics.median(r[key] for r in rows if r["variant"] == name)
                      for key in ("cpu_ms_per_request", "context_switches_per_request", "requests_per_s")}
               for name in dict.fromkeys(r["variant"] for r in rows)}
    for name, s in summary.items():
        print(f"median {name:<13} {s['cpu_ms_per_request']:.3f} ms CPU/req  "
              f"{s['context_switches_per_request']:.2f} ctx sw/req  {s['requests_per_s']:.0f} req/s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"setup": vars(args), "summary": summary, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
