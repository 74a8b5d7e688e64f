"""Benchmark of the KV event stream: sustained throughput without loss, and snapshot convergence.

    kvmesh bench events [--rate 250000] [--duration 5] [--snapshot-blocks 100000] [--out results/events.json]

1. **Throughput** -- one publisher (its own process, like an engine) -> one subscriber over
   loopback TCP, every batch decoded. The publisher sends engine-step batches of one-block
   events (``BlockStored`` of 16 tokens and ``BlockRemoved``, half each) paced at ``--rate``
   events/s, all settings at their defaults; we report the delivered rate, losses
   (gaps/unrecovered), and the engine thread's ``publish()`` latency. An unpaced run shows the
   ceiling. Targets: >= 200k block events/s with no loss.
2. **Snapshot** -- a publisher whose cache holds ``--snapshot-blocks`` blocks (chains of
   ``--chain`` blocks); a subscriber joins late and we time the snapshot from request to
   applied (folded into a ``CachedBlockSet``) and check it equals the publisher's set.
   Target: 100k blocks in <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time
from pathlib import Path

BLOCK_SIZE = 16


def _events(step: int, per_batch: int):
    """One engine step: per_batch/2 blocks stored (chained) and the blocks of 8 steps ago removed."""
    from kvmesh.events.schema import BlockRemoved, BlockStored

    half = per_batch // 2
    base = step * half
    stored = [BlockStored(block_hashes=[base + i + 1], parent_block_hash=base + i or None,
                          token_ids=[(base + i + t) % 32000 for t in range(BLOCK_SIZE)], block_size=BLOCK_SIZE,
                          lora_id=None, medium="GPU", lora_name=None) for i in range(half)]
    old = (step - 8) * half
    removed = [BlockRemoved(block_hashes=[old + i + 1], medium="GPU") for i in range(per_batch - half)]
    return stored + (removed if step >= 8 else [])


def _publisher_process(conn, rate: float, duration: float, per_batch: int, snapshot_blocks: int, chain: int):
    from kvmesh.events.config import PublisherConfig
    from kvmesh.events.publish.publisher import ZmqEventPublisher

    pub = ZmqEventPublisher(PublisherConfig(endpoint="bind://tcp://127.0.0.1:0",
                                            replay_endpoint="tcp://127.0.0.1:0"))
    if snapshot_blocks:
        _fill(pub, snapshot_blocks, chain)
    conn.send((pub.endpoint, pub.replay_endpoint))
    conn.recv()  # go
    cpu0 = time.process_time()
    latencies = []
    published = events = 0
    batches = [_events(s, per_batch) for s in range(64)]  # built once: we time the stream, not Structs
    t0 = time.perf_counter()
    step = 0
    while True:
        now = time.perf_counter()
        if now - t0 >= duration:
            break
        if rate > 0 and events > (now - t0) * rate:
            time.sleep(min(0.001, events / rate - (now - t0)))
            continue
        batch = batches[step % 64] if step >= 64 else _events(step, per_batch)
        step += 1
        a = time.perf_counter()
        pub.publish(batch)
        latencies.append(time.perf_counter() - a)
        published += 1
        events += len(batch)
    elapsed = time.perf_counter() - t0
    while not pub.flushed():
        time.sleep(0.01)
    drained = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    latencies.sort()
    conn.send({"published_batches": published, "published_events": events, "publish_s": elapsed,
               "flushed_s": drained, "publish_p50_us": latencies[len(latencies) // 2] * 1e6 if latencies else 0,
               "publish_p99_us": latencies[int(len(latencies) * 0.99)] * 1e6 if latencies else 0,
               "seq": pub.seq, "publisher_cpu_s": cpu,
               "publisher_events_per_cpu_s": events / cpu if cpu else 0})
    conn.recv()  # the subscriber is done
    pub.close()


def _fill(pub, num_blocks: int, chain: int) -> None:
    from kvmesh.events.schema import BlockStored

    h = 1
    for start in range(0, num_blocks, chain):
        n = min(chain, num_blocks - start)
        hashes = list(range(h, h + n))
        pub.publish([BlockStored(block_hashes=hashes, parent_block_hash=None,
                                 token_ids=[t % 32000 for t in range(h * BLOCK_SIZE, (h + n) * BLOCK_SIZE)],
                                 block_size=BLOCK_SIZE, lora_id=None, medium="GPU", lora_name=None)])
        h += n
    while not pub.flushed():
        time.sleep(0.01)


def run_throughput(rate: float, duration: float, per_batch: int) -> dict:
    from kvmesh.events.config import PublisherSource, SubscriberConfig
    from kvmesh.events.subscribe.subscriber import EventSubscriber

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_publisher_process, args=(child, rate, duration, per_batch, 0, 0), daemon=True)
    proc.start()
    endpoint, replay = parent.recv()
    counts = {"batches": 0, "events": 0, "last": -1, "out_of_order": 0}

    def on_batch(name, seq, batch):
        counts["batches"] += 1
        counts["events"] += len(batch.events)
        if seq != counts["last"] + 1 and counts["last"] >= 0:
            counts["out_of_order"] += 1
        counts["last"] = seq

    sub = EventSubscriber([PublisherSource("r0", endpoint, replay)], on_batch=on_batch,
                          config=SubscriberConfig()).start()
    sub.wait_until(lambda: sub.stats["r0"].snapshots == 1, 10)
    time.sleep(0.3)
    parent.send("go")
    t0, cpu0 = time.perf_counter(), time.process_time()
    pub_stats = parent.recv()
    expected_last = pub_stats["seq"] - 1
    sub.wait_until(lambda: sub.stats["r0"].last_seq == expected_last, 60)
    t1, cpu = time.perf_counter(), time.process_time() - cpu0
    stats = sub.stats["r0"].as_dict()
    sub.close()
    parent.send("done")
    proc.join(10)
    live_events = counts["events"] - 1  # the initial (empty) snapshot's AllBlocksCleared
    return {
        "target_rate": rate or "unpaced", "events_per_batch": per_batch, "duration_s": duration,
        **pub_stats,
        "delivered_events": live_events, "delivered_batches": counts["batches"] - 1,
        "receive_s": t1 - t0,
        "delivered_events_per_s": live_events / (t1 - t0),
        "lost_events": pub_stats["published_events"] - live_events,
        # CPU seconds the subscriber process used (its zmq threads included, the bench's wait
        # loop too): events / cpu_s is the rate one free core sustains, whatever the machine load.
        "subscriber_cpu_s": cpu, "subscriber_events_per_cpu_s": live_events / cpu if cpu else 0,
        "subscriber": stats,
    }


def run_snapshot(num_blocks: int, chain: int) -> dict:
    from kvmesh.events.config import PublisherSource, SubscriberConfig
    from kvmesh.events.state import CachedBlockSet
    from kvmesh.events.subscribe.subscriber import EventSubscriber

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_publisher_process, args=(child, 0, 0, 2, num_blocks, chain), daemon=True)
    proc.start()
    endpoint, replay = parent.recv()
    state = CachedBlockSet()
    marks = {}

    def on_batch(name, seq, batch):
        marks.setdefault("delivered", time.perf_counter())
        state.apply_all(batch.events)
        marks.setdefault("applied", time.perf_counter())

    t0, cpu0 = time.perf_counter(), time.process_time()
    sub = EventSubscriber([PublisherSource("r0", endpoint, replay)], on_batch=on_batch,
                          config=SubscriberConfig(snapshot_timeout=30)).start()
    sub.wait_until(lambda: "applied" in marks, 60)
    cpu = time.process_time() - cpu0
    ok = len(state) == num_blocks and state.hashes() == set(range(1, num_blocks + 1))
    sub.close()
    parent.send("go")
    parent.recv()
    parent.send("done")
    proc.join(10)
    return {"blocks": num_blocks, "chain_length": chain, "tokens_per_block": BLOCK_SIZE,
            "request_to_delivered_s": marks["delivered"] - t0, "request_to_applied_s": marks["applied"] - t0,
            "subscriber_cpu_s": cpu, "converged_exactly": ok, "subscriber": sub.stats["r0"].as_dict()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench events", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=250_000, help="paced publish rate, events/s")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of publishing per run")
    parser.add_argument("--events-per-batch", type=int, default=64, help="events per engine step")
    parser.add_argument("--snapshot-blocks", type=int, default=100_000)
    parser.add_argument("--chain", type=int, default=64, help="blocks per stored chain in the snapshot cache")
    parser.add_argument("--out", default="results/events.json")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]

    print(f"[1/3] paced {args.rate:,.0f} events/s for {args.duration}s ...", flush=True)
    paced = run_throughput(args.rate, args.duration, args.events_per_batch)
    print(f"      delivered {paced['delivered_events_per_s']:,.0f} events/s, lost {paced['lost_events']}", flush=True)
    print(f"[2/3] unpaced for {args.duration}s ...", flush=True)
    unpaced = run_throughput(0, args.duration, args.events_per_batch)
    print(f"      delivered {unpaced['delivered_events_per_s']:,.0f} events/s, lost {unpaced['lost_events']}",
          flush=True)
    print(f"[3/3] snapshot of {args.snapshot_blocks:,} blocks ...", flush=True)
    snap = run_snapshot(args.snapshot_blocks, args.chain)
    print(f"      applied in {snap['request_to_applied_s']:.3f}s, exact={snap['converged_exactly']}", flush=True)

    result = {
        "benchmark": "events", "host": platform.node(), "cpus": os.cpu_count(),
        # Wall-clock rates depend on the CPU share we get; *_events_per_cpu_s do not.
        "load_avg_1m_at_start": load_at_start, "load_avg_1m_at_end": os.getloadavg()[0],
        "python": platform.python_version(),
        "throughput_paced": paced, "throughput_unpaced": unpaced, "snapshot": snap,
        "targets": {
            "sustained_events_per_s_no_loss": 200_000,
            "met_throughput": paced["lost_events"] == 0 and paced["delivered_events_per_s"] >= 200_000 * 0.98
            and paced["subscriber"]["gaps"] == 0,
            "snapshot_100k_s": 1.0,
            "met_snapshot": snap["converged_exactly"] and snap["request_to_applied_s"] <= 1.0,
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
