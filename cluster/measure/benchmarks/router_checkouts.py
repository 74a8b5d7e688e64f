"""Whole-router CPU per request over HTTP, this checkout's router against another checkout's, alternating.

    kvmesh bench router_checkouts --tree main=/path/to/other/checkout [--rounds 4] [--duration 3]
        [--out results/router_checkouts.json]

router-peers' setup (two instant stub replicas and wrk with 64 clients on core 1, the router alone on
core 0, its workloads: 1k-token text, the same as token ids, 8-turn chats) with two kvmesh routers, one
importing kvmesh from this checkout and one from ``--tree`` (router_parse.use_tree), measured one after
the other per workload and round; router process CPU per request, medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.router_parse import HERE, write_tree_comparison
from kvmesh.cluster.measure.benchmarks.router_peers import LLAMA2_CHAT_TEMPLATE, PATHS, STORIES, workloads
from kvmesh.cluster.measure.benchmarks.support.peer_load import (
    free_port,
    pinned,
    run_wrk,
    start_stub_replicas,
    tree_cpu_seconds,
    wait_http,
)


def _router(tree: Path, stubs: list[str], template: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = ["router", "--model", str(STORIES), "--max-model-len", "8192", "--chat-template", template,
            "--log-level", "warning", "--host", "127.0.0.1", "--port", str(port)]
    args += [x for url in stubs for x in ("--replica", url)]
    code = (f"import sys, pathlib; sys.path.insert(0, {str(Path(__file__).parent)!r}); import router_parse; "
            f"router_parse.use_tree(pathlib.Path({str(tree)!r})); from kvmesh.cluster.cli import main; "
            f"sys.exit(main({args!r}))")
    proc = subprocess.Popen(pinned([sys.executable, "-c", code], 0))
    url = f"http://127.0.0.1:{port}"
    wait_http(url, proc=proc)
    return proc, url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench router_checkouts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, metavar="NAME=PATH", help="the other checkout")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of wrk load per measurement")
    ap.add_argument("--out", default="results/router_checkouts.json")
    args = ap.parse_args(argv)
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    bodies = workloads(load_tokenizer(STORIES, max_model_len=8192))
    name, path = args.tree.split("=", 1)
    trees = {"this": HERE, name: Path(path).resolve()}
    procs, rows = [], []
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(LLAMA2_CHAT_TEMPLATE)
    try:
        stubs = start_stub_replicas(procs)
        routers = {}
        for tree_name, tree in trees.items():
            routers[tree_name] = _router(tree, stubs, f.name)
            procs.append(routers[tree_name][0])
        time.sleep(1.0)
        for rnd in range(args.rounds):
            for workload, items in bodies.items():
                for tree_name, (proc, url) in routers.items():
                    run_wrk(url, PATHS[workload], items, 64, 1.0, cpu=1)  # warm
                    cpu0 = tree_cpu_seconds(proc.pid)
                    sat = run_wrk(url, PATHS[workload], items, 64, args.duration, cpu=1)
                    ms = 1e3 * (tree_cpu_seconds(proc.pid) - cpu0) / max(sat["requests"], 1)
                    rows.append({"round": rnd, "tree": tree_name, "workload": workload, "cpu_ms_per_request": ms,
                                 "requests": sat["requests"], "errors": sat["socket_errors"] + sat["status_errors"]})
                    print(f"round {rnd} {workload:<9} {tree_name:<6} {ms:.3f} ms CPU/req", flush=True)
    finally:
        for p in reversed(procs):
            p.terminate()
        Path(f.name).unlink()
    summary = {t: {w: statistics.median(r["cpu_ms_per_request"] for r in rows if r["tree"] == t and r["workload"] == w)
                   for w in bodies} for t in trees}
    for t, ws in summary.items():
        print(f"median {t:<6} " + "  ".join(f"{w} {ms:.3f} ms" for w, ms in ws.items()))
    write_tree_comparison(args.out, trees, summary, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
