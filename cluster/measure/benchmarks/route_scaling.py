"""What one routing decision costs as the fleet grows: ``kvmesh sim`` (the router's own ``KVRouter``) at 16, 128 and
1,024 replicas, its ``route_ms_per_request`` beside the hit rate and TTFT the decisions produced.

    python -m kvmesh.cluster.measure.benchmarks.route_scaling --checkout one-by-one=../older --checkout columns= \\
        --out results/route_scaling.json
    python -m kvmesh.cluster.measure.benchmarks.route_scaling --table results/route_scaling.json

Each cell is one ``kvmesh sim --synthetic 4000 --blocks-per-replica 4000 --num-replicas N --policies cache_aware``
process. ``--checkout LABEL=PATH`` measures the kvmesh of the repository checked out at PATH (its folders are
laid out as the ``kvmesh`` package on PYTHONPATH; its compiled fast path must be built there); an empty PATH
measures the installed one. Labels run interleaved per fleet size, so a busy machine weighs on each alike. The
results file keeps every cell's summary and whether the labels' outputs agree field for field (timing aside).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOPS = ("cluster", "events", "kvcache", "replica", "router")
"""The repository's folders the ``kvmesh`` package maps (pyproject.toml's package-dir)."""
TIMING = frozenset({"wall_s", "cpu_s", "route_ms_per_request", "events_per_s", "index_blocks_per_s"})
"""Report fields that measure the machine, not the decisions."""


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m kvmesh.cluster.measure.benchmarks.route_scaling",
                                description=__doc__.split("\n")[0])
    p.add_argument("--checkout", action="append", default=[], metavar="LABEL=PATH",
                   help="a kvmesh to measure (PATH: a repository checkout; empty: the installed kvmesh); repeatable")
    p.add_argument("--replicas", default="16,128,1024", help="fleet sizes, comma-separated")
    p.add_argument("--requests", type=int, default=4000, help="--synthetic N")
    p.add_argument("--blocks-per-replica", type=int, default=4000)
    p.add_argument("--policies", default="cache_aware")
    p.add_argument("--out", default="results/route_scaling.json")
    p.add_argument("--table", metavar="FILE", help="print the markdown table of a results file and exit")
    return p.parse_args(argv)


def package_path(checkout: str, tmp: Path) -> str | None:
    """A PYTHONPATH entry under which ``kvmesh`` is ``checkout``'s folders (None: the installed kvmesh)."""
    if not checkout:
        return None
    root = tmp / Path(checkout).resolve().name / "kvmesh"
    root.mkdir(parents=True, exist_ok=True)
    for top in TOPS:
        link = root / top
        if not link.exists():
            link.symlink_to(Path(checkout).resolve() / top)
    return str(root.parent)


DRIVER = """
import json, sys, time
from kvmesh.router.routing.kv_router import KVRouter
route, spent = KVRouter.route, [0.0, 0]
def timed(self, *args, **kwargs):  # the decision's CPU time, whatever else shares the machine
    t0 = time.thread_time()
    try:
        return route(self, *args, **kwargs)
    finally:
        spent[0] += time.thread_time() - t0
        spent[1] += 1
KVRouter.route = timed
from kvmesh.cluster.cli import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"route_cpu_s": spent[0], "routes": spent[1]}, f)
sys.exit(code)
"""
"""Runs ``kvmesh sim`` (argv[2:]) with ``KVRouter.route``'s CPU seconds summed into the file argv[1]."""


def run_cell(pythonpath: str | None, replicas: int, args) -> dict:
    """One ``kvmesh sim`` run: its per-policy report, and ``KVRouter.route``'s CPU ms per call over the run."""
    with tempfile.TemporaryDirectory() as tmp:
        out, cpu = Path(tmp) / "sim.json", Path(tmp) / "cpu.json"
        cmd = [sys.executable, "-c", DRIVER, str(cpu), "sim", "--synthetic", str(args.requests),
               "--blocks-per-replica", str(args.blocks_per_replica), "--num-replicas", str(replicas),
               "--policies", args.policies, "--no-plot", "--no-progress", "--out", str(out)]
        env = os.environ.copy()
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=tmp)
        spent = json.loads(cpu.read_text())
        return json.loads(out.read_text())["policies"], 1000 * spent["route_cpu_s"] / max(spent["routes"], 1)


def differences(a, b, path: str = "") -> list[str]:
    """Where two reports differ, timing fields aside (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key in TIMING:
                continue
            if key not in a or key not in b:
                out.append(f"{path}/{key}: only in one")
            else:
                out += differences(a[key], b[key], f"{path}/{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    checkouts = dict(c.split("=", 1) for c in args.checkout) or {"installed": ""}
    sizes = [int(n) for n in args.replicas.split(",")]
    cells: dict[str, dict[str, dict]] = {label: {} for label in checkouts}
    agree: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {label: package_path(path, Path(tmp)) for label, path in checkouts.items()}
        for n in sizes:
            reports = {}
            for label in checkouts:
                t0 = time.perf_counter()
                reports[label], cpu_ms = run_cell(paths[label], n, args)
                summary = {name: {"route_ms_per_request": p["route_ms_per_request"], "hit_rate": p["hit_rate"],
                                  "ttft_p50_s": p["ttft_s"]["p50"], "ttft_p99_s": p["ttft_s"]["p99"]}
                           for name, p in reports[label].items()}
                cells[label][str(n)] = {"policies": summary, "route_cpu_ms": cpu_ms,
                                        "wall_s": time.perf_counter() - t0}
                print(f"{label:>12} {n:>5} replicas: KVRouter.route {cpu_ms:.3f} ms CPU/call; " + ", ".join(
                    f"{name} {s['route_ms_per_request']:.3f} ms/request (wall), hit {s['hit_rate']:.4f}"
                    for name, s in summary.items()), flush=True)
            first, *rest = checkouts
            agree[str(n)] = [f"{label}{d}" for label in rest for d in differences(reports[first], reports[label])]
    result = {"bench": "route-scaling", "requests": args.requests, "blocks_per_replica": args.blocks_per_replica,
              "policies": args.policies.split(","), "cells": cells,
              "differences": agree, "same_outputs": {n: not d for n, d in agree.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"wrote {args.out}")


def table(result: dict) -> str:
    """The markdown table of a results file, one row per fleet size: per label ``KVRouter.route``'s CPU ms per call
    (the sim's wall ``route_ms_per_request`` in brackets), the first policy's hit rate and TTFT (the last label's),
    and whether every label's outputs were the same."""
    labels = list(result["cells"])
    sizes = list(next(iter(result["cells"].values())))
    policy = result["policies"][0]
    lines = ["| replicas | " + " | ".join(labels) + " | hit | TTFT p50 / p99 | same |",
             "|---" * (len(labels) + 4) + "|"]
    for n in sizes:
        cells = [result["cells"][label][n] for label in labels]
        last = cells[-1]["policies"][policy]
        lines.append(f"| {int(n):,} | " + " | ".join(
            f"{c['route_cpu_ms']:.2f} ({c['policies'][policy]['route_ms_per_request']:.2f})" for c in cells)
            + f" | {last['hit_rate']:.1%} | {last['ttft_p50_s']:.3f} / {last['ttft_p99_s']:.3f} s | "
            + ("yes" if result["same_outputs"][n] else "no") + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
