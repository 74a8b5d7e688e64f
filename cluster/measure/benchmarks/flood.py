"""A hostile plain-ZeroMQ event stream at full speed against a router that also routes to a healthy replica
(the router's RSS grew ~1.7 GB per 6 s until the kernel killed it).

    kvmesh bench flood [--duration 60] [--baseline 5] [--out results/flood.json]

Processes: ``kvmesh router --workers 1`` (its own process: its RSS is what we watch); a *healthy*
replica (``fake_replica`` with a prefix cache: a real prefix cache whose events the router follows); a *hostile* one
whose HTTP is an instant stub and whose event stream (plain PUB, no replay socket, as a vLLM upstream
replica's) is support/flooder.py's; one client (support/flood_client.py) sending completions one at a time through
the router, each a shared 64-token prefix (32 of them, cached on the healthy replica beforehand) plus a fresh
16-token suffix. Phases: ``--baseline`` seconds without the flood, then ``--duration`` seconds of it.
The flooder cycles, as fast as the router reads, through garbage payloads, wrong frame counts and seq
frames, payloads over ``max_payload_bytes``, valid batches of 65,536 blocks (~6 MB) and of more blocks
than a batch may name, valid batches claiming the client's prefixes, and every 5 s one message over
ZeroMQ's MAXMSGSIZE. ``--mix`` picks another attack (support/flooder.py): ``valid`` (only huge valid
batches), ``endless`` (one multipart message that never ends), ``hostile`` (frames costly to
decode -- nested arrays, 200,000-event batches -- and a replay socket answering undecodable snapshot
frames). Reported: the router's RSS (start of the flood, peak, growth; sampled every 0.25 s), its CPU,
per phase the client's latency p50/p99, hit rate (cached / prompt tokens) and routes (route reason and
replica, from the receipt headers), what the router said of the honest replica every 0.5 s (degraded?
lag of its last applied batch), six follow-ups at the end of the flood (prompts the honest replica
answered plus fresh tokens: routed for their cache, and given it?), the hostile source's counters,
``/health`` at the end, and tracebacks in the router's log. Plot: RSS and latency over time (``--out``
with ``.png``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.flood_client import (
    FloodClient,
    Watch,
    follow_ups,
    get,
    latency_buckets,
    phase,
    rss_mb,
    summarize,
)
from kvmesh.cluster.measure.benchmarks.support.flooder import BLOCK_SIZE, hostile_publisher
from kvmesh.cluster.measure.benchmarks.support.peer_load import (
    free_port,
    start_stub_replicas,
    stop_processes,
    tree_cpu_seconds,
    wait_http,
)
from kvmesh.cluster.measure.shared_dir import stories_model

ROOT = Path(__file__).resolve().parents[3]
STORIES = stories_model()


def run(duration: float, baseline: float, model: str = str(STORIES), rss_cap_mb: float = 2048,
        mix: str = "all") -> dict:
    """Run the whole scenario (see the module doc); the results as a dict."""
    with tempfile.TemporaryFile("w+") as log:  # the router's stderr
        return _run(duration, baseline, model, rss_cap_mb, mix, log)


def _run(duration: float, baseline: float, model: str, rss_cap_mb: float, mix: str, log) -> dict:
    ctx = mp.get_context("spawn")
    endpoint_q, counts_q, go, stop = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    flooder = ctx.Process(target=hostile_publisher, args=(endpoint_q, go, stop, counts_q, mix), daemon=True)
    procs: list[subprocess.Popen] = []
    try:
        flooder.start()
        healthy = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.support.fake_replica",
                                    "--name", "healthy", "--event-port", "0", "--block-size", str(BLOCK_SIZE)],
                                   stdout=subprocess.PIPE, text=True)
        procs.append(healthy)
        stub_url = start_stub_replicas(procs, 1)[0]
        info = json.loads(healthy.stdout.readline())
        hostile_events, hostile_replay = endpoint_q.get(timeout=60)
        hostile = f"{stub_url},events={hostile_events},name=hostile" + (f",replay={hostile_replay}"
                                                                        if hostile_replay else "")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        router = subprocess.Popen([
            sys.executable, "-m", "kvmesh.cluster.cli", "router", "--model", model, "--max-model-len", "1024",
            "--block-size", str(BLOCK_SIZE), "--workers", "1", "--host", "127.0.0.1", "--port", str(port),
            "--poll-interval-s", "0.5", "--log-level", "warning",
            "--replica", f"{info['url']},events={info['events']},replay={info['replay']},name=healthy",
            "--replica", hostile], stderr=log)
        procs.append(router)
        wait_http(url, proc=router)
        wait_http(url, "/v1/models", proc=router)
        warm = FloodClient(info["url"])  # cache every prefix on the healthy replica, directly
        for _ in range(2):
            for p in warm.prefixes:
                warm.conn.request("POST", "/v1/completions", json.dumps({"prompt": p, "max_tokens": 1}))
                warm.conn.getresponse().read()
        time.sleep(0.3)  # the router applies their events
        client, samples, watch = FloodClient(url), [], Watch(url)
        cpu_before = tree_cpu_seconds(router.pid)
        before = phase(client, baseline, router.pid, samples, rss_cap_mb, watch)
        rss_start, cpu_start = rss_mb(router.pid), tree_cpu_seconds(router.pid)
        cpu_before = (cpu_start - cpu_before) / baseline
        go.set()
        t_flood = time.monotonic()
        during = phase(client, duration, router.pid, samples, rss_cap_mb, watch)
        followed = follow_ups(client, during)  # still flooding
        samples.append((time.monotonic(), rss_mb(router.pid)))
        flooded = time.monotonic() - t_flood
        cpu = tree_cpu_seconds(router.pid) - cpu_start
        stop.set()
        health_status, health = get(url, "/health")
        _, metrics = get(url, "/metrics")
        alive = router.poll() is None
    finally:
        stop.set()
        go.set()
        stop_processes(procs, 10)
        try:
            counts = counts_q.get(timeout=10) if flooder.pid is not None else {}
        except queue.Empty:
            counts = {}
        if flooder.pid is not None:
            flooder.join(10)
            if flooder.is_alive():
                flooder.kill()
        log.seek(0)
        router_log = log.read()
    hostile_counters = {line.split('counter="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
               for line in metrics.splitlines()
               if line.startswith("kvmesh_router_event_stream_total{") and 'replica="hostile"' in line}
    flood_rss = [mb for t, mb in samples if t >= t_flood]
    return {
        "benchmark": "flood", "mix": mix, "duration_s": duration, "baseline_s": baseline, "router_alive": alive,
        "rss_mb": {"flood_start": rss_start, "peak": max(flood_rss), "end": flood_rss[-1],
                   "growth": max(flood_rss) - rss_start},
        "flooded_s": flooded, "router_cpu_s_per_s": {"baseline": cpu_before, "flood": cpu / flooded},
        "baseline": summarize(before), "flood": summarize(during), "follow_ups": followed,
        "honest": watch.summary(t_flood),
        "health_status": health_status, "health": json.loads(health),
        "hostile_counters": hostile_counters, "flooder": counts,
        "router_log_tracebacks": router_log.count("Traceback"),
        "router_log_lines": len(router_log.splitlines()),
        "series": {"rss": [(round(t - t_flood, 3), round(mb, 1)) for t, mb in samples],
                   "latency": latency_buckets([(r["t"] - t_flood, r["ms"]) for r in before + during])},
        "machine": {"cpus": os.cpu_count()},
    }


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    t, mb = zip(*result["series"]["rss"], strict=True)
    ax1.plot(t, mb)
    ax1.set_ylabel("router RSS (MB)")
    ax1.axvline(0, color="red", linestyle=":", label="flood starts")
    ax1.legend()
    t, p50, worst, _ = zip(*result["series"]["latency"], strict=True)
    ax2.plot(t, p50, label="p50")
    ax2.plot(t, worst, ".", markersize=3, label="max")
    ax2.set_yscale("log")
    ax2.set_ylabel("request latency per 0.25 s (ms)")
    ax2.legend()
    ax2.set_xlabel("seconds since the flood started")
    fig.suptitle(f"hostile plain event stream: RSS growth {result['rss_mb']['growth']:.0f} MB, hit rate "
                 f"{result['baseline']['hit_rate']:.3f} -> {result['flood']['hit_rate']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvmesh bench flood", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of flooding")
    ap.add_argument("--baseline", type=float, default=5.0, help="seconds of traffic before the flood")
    ap.add_argument("--model", default=str(STORIES), help="the router's tokenizer")
    ap.add_argument("--rss-cap-mb", type=float, default=2048, help="stop the flood once the router's RSS passes this")
    ap.add_argument("--mix", choices=["all", "valid", "endless", "hostile"], default="all",
                    help="all: every kind of bad and huge message; valid: only valid 65,536-block batches; "
                         "endless: raw ZMTP, one multipart message that never ends; hostile: frames expensive "
                         "to decode (nested arrays, 200,000-event batches, undecodable snapshot frames)")
    ap.add_argument("--out", default="results/flood.json")
    args = ap.parse_args(argv)
    print(f"flood: {args.baseline:g} s baseline, then {args.duration:g} s of hostile traffic ...", flush=True)
    result = run(args.duration, args.baseline, args.model, args.rss_cap_mb, args.mix)
    for key in ("rss_mb", "router_cpu_s_per_s", "baseline", "flood", "honest", "follow_ups", "hostile_counters",
                "flooder"):
        print(f"  {key}: {json.dumps(result[key])}")
    print(f"  router alive {result['router_alive']}, /health {result['health_status']} degraded "
          f"{result['health'].get('degraded_replicas')}, tracebacks {result['router_log_tracebacks']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    plot(result, str(Path(args.out).with_suffix(".png")))
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
