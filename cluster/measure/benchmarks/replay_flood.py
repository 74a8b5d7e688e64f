"""Flood a replica's replay/snapshot socket and measure what it costs the replica, with and without
the socket's limits (a peer that asks for snapshots and never reads them).

    python -m kvmesh.cluster.measure.benchmarks.replay_flood [--blocks 5000] [--duration 5] [--rate 200]
                                                     [--rounds 2] [--out results/replay_flood.json]

Each run starts two processes: a *replica* -- a ``ZmqEventPublisher`` whose cache holds ``--blocks``
blocks of 16 tokens, and an engine-like thread that publishes one small batch per 5 ms step -- and
a *flooder* whose DEALER sockets send ``--rate`` snapshot requests per second for ``--duration``
seconds and never read an answer. We report the replica's RSS (before, peak, growth), the engine
step's overrun p50/p99 (how late a 5 ms step ends: GIL time taken by the I/O thread) and the
replica's CPU seconds, per request received. Variants alternate (``unlimited``, ``limited``, ...)
in fresh processes so that machine noise hits both alike; limits are the defaults of
``PublisherConfig`` against values so high that they never bind.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import threading
import time
from pathlib import Path

BLOCK_SIZE = 16
STEP_S = 0.005
UNLIMITED = {"replay_requests_per_s": 1e9, "replay_request_burst": 10**9, "snapshots_per_s": 1e9,
             "snapshot_burst": 10**9, "replay_bytes_per_s": 1 << 50, "replay_max_queued_bytes": 1 << 50}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _replica(limits: dict, blocks: int, duration: float, ready, out) -> None:
    from kvmesh.events.config import PublisherConfig
    from kvmesh.events.publish.publisher import ZmqEventPublisher
    from kvmesh.events.schema import BlockStored

    def block(h: int) -> BlockStored:
        return BlockStored(block_hashes=[h], parent_block_hash=h - 1 if h % 64 != 1 else None,
                           token_ids=[(h + t) % 32000 for t in range(BLOCK_SIZE)], block_size=BLOCK_SIZE,
                           lora_id=None, medium="GPU", lora_name=None)

    pub = ZmqEventPublisher(PublisherConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0",
                                            **limits))
    for start in range(1, blocks + 1, 1000):
        pub.publish([block(h) for h in range(start, min(start + 1000, blocks + 1))])
    while not pub.flushed():
        time.sleep(0.01)
    rss_before = _rss_mb()
    cpu_before = sum(os.times()[:2])
    peak = [rss_before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], _rss_mb())

    threading.Thread(target=sample, daemon=True).start()
    ready.put(pub.replay_endpoint)
    overruns, h = [], blocks + 1
    deadline = time.monotonic() + duration + 0.5
    while time.monotonic() < deadline:  # the engine: one step every 5 ms, publishing its events
        t0 = time.perf_counter()
        time.sleep(STEP_S)
        pub.publish([block(h)])
        h += 1
        overruns.append(time.perf_counter() - t0 - STEP_S)
    stop.set()
    cpu = sum(os.times()[:2]) - cpu_before
    stats = pub.stats
    pub.close()
    overruns.sort()
    out.put({"rss_before_mb": rss_before, "rss_peak_mb": peak[0], "rss_growth_mb": peak[0] - rss_before,
             "step_overrun_p50_ms": 1e3 * statistics.median(overruns),
             "step_overrun_p99_ms": 1e3 * overruns[int(0.99 * (len(overruns) - 1))],
             "replica_cpu_s": cpu, "snapshots_sent": stats["snapshots"], "throttled": stats["throttled"]})


def _flooder(endpoint: str, rate: float, duration: float, out) -> None:
    import zmq

    ctx = zmq.Context()
    socks = []
    for _ in range(8):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        # Read nothing, queue (almost) nothing: the answers back up in the replica's ROUTER --
        # the replica's memory, the case.
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.connect(endpoint)
        socks.append(s)
    sent, start = 0, time.monotonic()
    while (elapsed := time.monotonic() - start) < duration:
        while sent < elapsed * rate:
            socks[sent % len(socks)].send_multipart([b"", b"kvmesh:snapshot"])
            sent += 1
        time.sleep(0.002)
    out.put(sent)
    time.sleep(0.5)  # keep the connections (and what they queued) until the replica has measured
    for s in socks:
        s.close()
    ctx.term()


def run_once(variant: str, blocks: int, duration: float, rate: float) -> dict:
    ctx = mp.get_context("spawn")
    ready, out, sent_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    limits = UNLIMITED if variant == "unlimited" else {}
    replica = ctx.Process(target=_replica, args=(limits, blocks, duration, ready, out))
    replica.start()
    endpoint = ready.get(timeout=120)
    flooder = ctx.Process(target=_flooder, args=(endpoint, rate, duration, sent_q))
    flooder.start()
    result = out.get(timeout=duration + 120)
    sent = sent_q.get(timeout=30)
    for p in (flooder, replica):
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    result.update(variant=variant, requests=sent,
                  replica_cpu_ms_per_request=1e3 * result["replica_cpu_s"] / max(sent, 1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=5_000, help="blocks in the replica's cache")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of flooding per run")
    parser.add_argument("--rate", type=float, default=200.0, help="snapshot requests per second")
    parser.add_argument("--rounds", type=int, default=2, help="runs per variant (alternating)")
    parser.add_argument("--out", default="results/replay_flood.json")
    args = parser.parse_args(argv)
    runs = []
    for r in range(args.rounds):
        for variant in ("unlimited", "limited"):
            print(f"round {r + 1}/{args.rounds}: {variant} ...", flush=True)
            res = run_once(variant, args.blocks, args.duration, args.rate)
            print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()),
                  flush=True)
            runs.append(res)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "benchmark": "replay_flood", "blocks": args.blocks, "duration_s": args.duration, "rate": args.rate,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "runs": runs}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
