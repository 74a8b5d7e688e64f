"""Startup benchmark: time from ``kvmesh serve`` to ready, and memory (RSS) per replica.

    kvmesh bench startup [--runs 1] [--replicas 2] [--model embedded] [--out results/startup.json]

Each run starts ``kvmesh serve`` as a user would (a subprocess, embedded Ray on CPU, fresh model
cache dir unless --warm-cache), times every progress line it prints until "kvmesh is ready",
sends one request, measures the RSS of each replica actor process (``ray::ReplicaActor``), the
driver (router + supervisor) and Ray's own processes, then stops it with SIGINT and times that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _rss_mib(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


def _cmdline(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


async def _post_status(url: str, body: dict) -> int:
    """The HTTP status of one ``POST url`` (answer read in full)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client, \
            client.post(url, json=body) as r:
        await r.read()
        return r.status


def one_run(args: argparse.Namespace, run_index: int) -> dict:
    port = _free_port()
    argv = [sys.executable, "-m", "kvmesh.cluster.cli", "serve", "--port", str(port),
            "--num-replicas", str(args.replicas), "--model", args.model]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cache = None if args.warm_cache else tempfile.mkdtemp(prefix="kvmesh-bench-cache-")
    if cache:
        env["KVMESH_CACHE_DIR"] = cache
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    stages: list[dict] = []
    output: list[str] = []
    ready_s = reported_s = None
    for line in proc.stdout:
        output.append(line)
        now = time.monotonic() - t0
        if line.startswith("kvmesh: "):
            stages.append({"t_s": round(now, 2), "message": line[8:].strip()[:160]})
            print(f"  [run {run_index}] {now:6.1f}s {line[8:].strip()[:100]}", flush=True)
        m = re.match(r"kvmesh is ready in ([0-9.]+)s", line)
        if m:
            ready_s, reported_s = now, float(m.group(1))
            break
        if now > args.timeout:
            break
    if ready_s is None:
        proc.kill()
        raise RuntimeError(f"serve did not get ready within {args.timeout}s; its output:\n" + "".join(output[-20:]))
    t1 = time.monotonic()
    first_status = asyncio.run(_post_status(f"http://127.0.0.1:{port}/v1/completions", {
        "model": "kvmesh-embedded" if args.model == "embedded" else args.model,
        "prompt": "Once upon a time", "max_tokens": 16}))
    first_request_s = time.monotonic() - t1
    pids = _tree(proc.pid)
    replicas = {p: _rss_mib(p) for p in pids if _cmdline(p).startswith("ray::ReplicaActor")}
    ray_system = sum(_rss_mib(p) for p in pids if p not in replicas)
    driver_rss = _rss_mib(proc.pid)
    t2 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    stop_s = time.monotonic() - t2
    return {
        "ready_s": round(ready_s, 2), "ready_reported_s": reported_s, "stages": stages,
        "first_request_s": round(first_request_s, 3), "first_request_status": first_status,
        "replica_rss_mib": sorted(round(v, 1) for v in replicas.values()),
        "driver_rss_mib": round(driver_rss, 1),
        "other_processes_rss_mib": round(ray_system, 1), "num_processes": len(pids),
        "stop_s": round(stop_s, 2), "exit_code": proc.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--warm-cache", action="store_true", help="reuse ~/.cache/kvmesh (no model build)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", default="results/startup.json")
    args = parser.parse_args(argv)
    runs = []
    for i in range(args.runs):
        runs.append(one_run(args, i))
    ready = [r["ready_s"] for r in runs]
    rss = [v for r in runs for v in r["replica_rss_mib"]]
    result = {
        "benchmark": "startup", "command": f"kvmesh serve --num-replicas {args.replicas} --model {args.model}",
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "ready_s_median": statistics.median(ready), "ready_s_all": ready,
        "replica_rss_mib_median": round(statistics.median(rss), 1) if rss else None,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"ready in {result['ready_s_median']:.1f}s (median of {len(ready)}), replica RSS "
          f"{result['replica_rss_mib_median']} MiB (median), stop {runs[-1]['stop_s']}s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
