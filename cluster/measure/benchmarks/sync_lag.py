"""The sync stream's lag: from one router publishing a choice to another applying it (router/control/router_sync.py).

    kvmesh bench sync_lag                         # results/sync_lag.json: 2,000 choices 2 ms apart over loopback
    kvmesh bench sync_lag --choices 500 --out /tmp/sync_lag.json

Router A (this process) publishes choices on a PUB bound on 127.0.0.1, each for a prompt of ``--keys`` block keys,
``--interval-ms`` apart; router B, another process (this module with ``--follow ENDPOINT``), follows it and notes the
moment each booking is applied on its event loop. Both read the host's monotonic clock. A second of warm-up choices
goes first (a subscriber joins a moment after it connects); only the measured ones count. Reported: the lag's
percentiles, the choices lost, B's CPU per choice, and the load average, on which the figures depend. The routers'
turns (``router.sync.turn_s``, router/control/turns.py) are meant to be longer than this lag's high percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

from kvmesh.cluster.measure.benchmarks.support.work_dir import write_results

WARMUP_S = 1.0
"""Seconds of warm-up choices before the measured ones."""
MEASURED, WARMUP = "r0", "r1"
"""The replica the measured choices name, and the one the warm-up's name."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvmesh bench sync_lag", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--choices", type=int, default=2000, help="measured choices")
    ap.add_argument("--interval-ms", type=float, default=2.0, help="milliseconds between two choices")
    ap.add_argument("--keys", type=int, default=64, help="block keys per choice (a 1k-token prompt of 16-token blocks)")
    ap.add_argument("--follow", default=None, help=argparse.SUPPRESS)  # the follower's process: the leader's PUB
    ap.add_argument("--deadline-s", type=float, default=60.0, help=argparse.SUPPRESS)  # the follower's longest run
    ap.add_argument("--out", default="results/sync_lag.json")
    return ap


def _router():
    """A router with two replicas that have published their load (so another router's bookings are counted)."""
    from kvmesh.events.publish.load_ledger import LoadLedger
    from kvmesh.router.config import RouterConfig, build_router
    from kvmesh.router.control.sync_wire import key_seed

    router = build_router(RouterConfig(), seed=key_seed("kvmesh-bench-sync-lag"))
    for rid in ("r0", "r1"):
        router.add_replica(rid)
        router.loads.apply_published(router.replicas.get(rid), LoadLedger().update(0.0, 0.0, 0, 0, 0, 0.0))
    return router


def _sync(router, config, max_keys: int):
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.router.control.router_sync import RouterSync

    return RouterSync(router, config, SubscriberConfig(), max_keys, asyncio.get_running_loop()).start()


async def follow(endpoint: str, expect: int, deadline_s: float) -> dict:
    """Router B: follow ``endpoint`` until ``expect`` measured bookings (those on replica ``MEASURED``) were applied or
    the deadline passed; each one's apply time (monotonic) and this process's CPU from the first of them."""
    from kvmesh.router.config import SyncConfig

    router = _router()
    applied: dict[int, float] = {}
    cpu: list[float] = []
    booked = router.loads.peer_booked

    def noted(replica, router_id, number, tokens, now=None):
        if replica.id == MEASURED:
            applied[number] = time.monotonic()
            if not cpu:
                cpu.append(time.process_time())
        return booked(replica, router_id, number, tokens, now)

    router.loads.peer_booked = noted
    sync = _sync(router, SyncConfig(peers=(endpoint,)), 1 << 16)
    print("ready", flush=True)
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end and len(applied) < expect:
            await asyncio.sleep(0.05)
    finally:
        sync.close()
    measured = len(applied)
    cpu_s = time.process_time() - cpu[0] if cpu else 0.0
    return {"applied": {str(n): t for n, t in applied.items()}, "cpu_s": cpu_s, "measured": measured}


async def lead(args: argparse.Namespace) -> dict:
    """Router A: start B, publish the warm-up and the measured choices, and read what B applied when."""
    from kvmesh.router.config import SyncConfig

    router = _router()
    sync = _sync(router, SyncConfig(bind="tcp://127.0.0.1:0"), 1 << 16)
    deadline_s = WARMUP_S + args.choices * args.interval_ms / 1000 + 30
    proc = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.sync_lag", "--follow",
                             sync.endpoint, "--choices", str(args.choices), "--deadline-s", str(deadline_s)],
                            stdout=subprocess.PIPE, text=True)
    sent: dict[int, float] = {}
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the follower did not start")
        replica, keys = router.replicas.get(MEASURED), list(range(1, args.keys + 1))
        warm_end = time.monotonic() + WARMUP_S
        warmups = 0
        while time.monotonic() < warm_end:
            warmups += 1
            router.choices_out(router.replicas.get(WARMUP), warmups, 16 * args.keys, keys)
            await asyncio.sleep(args.interval_ms / 1000)
        next_at = time.monotonic()
        for number in range(1, args.choices + 1):
            next_at += args.interval_ms / 1000
            sent[number] = time.monotonic()
            router.choices_out(replica, number, 16 * args.keys, keys)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        out, _ = await asyncio.to_thread(proc.communicate, timeout=deadline_s + 30)
    finally:
        sync.close()
        if proc.poll() is None:
            proc.kill()
    followed = json.loads(out.splitlines()[-1])
    lags = [1000 * (followed["applied"][str(n)] - t) for n, t in sent.items() if str(n) in followed["applied"]]
    return {"setup": {"choices": args.choices, "interval_ms": args.interval_ms, "keys": args.keys,
                      "warmup_choices": warmups, "where": "two processes on one host, over loopback (127.0.0.1)"},
            "sent": len(sent), "applied": len(lags), "lost": len(sent) - len(lags),
            "lag_ms": _percentiles(lags),
            "follower_cpu_us_per_choice": round(1e6 * followed["cpu_s"] / max(1, followed["measured"]), 1),
            "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


def _percentiles(ms: list[float]) -> dict[str, float] | None:
    if len(ms) < 2:
        return None
    q = statistics.quantiles(ms, n=100)
    return {"p50": round(q[49], 2), "p90": round(q[89], 2), "p99": round(q[98], 2), "max": round(max(ms), 2)}


def table(result: dict) -> str:
    """The run as a Markdown table (``kvmesh bench report``'s ``sync_lag`` kind)."""
    s, lag = result["setup"], result["lag_ms"] or {}
    load = ", ".join(f"{x:g}" for x in result["load_average"])
    cpu = result["follower_cpu_us_per_choice"]
    return ("| choices (keys each, apart) | lag p50 | p90 | p99 | max | lost | follower CPU per choice | load average "
            f"(1, 5, 15 min; {result['cpus']} CPUs) |\n|---|---|---|---|---|---|---|---|\n"
            f"| {result['sent']:,} ({s['keys']}, {s['interval_ms']:g} ms) | {lag.get('p50')} ms | {lag.get('p90')} ms "
            f"| {lag.get('p99')} ms | {lag.get('max')} ms | {result['lost']} | {cpu} us | {load} |")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.follow is not None:
        print(json.dumps(asyncio.run(follow(args.follow, args.choices, args.deadline_s))), flush=True)
        return 0
    result = asyncio.run(lead(args))
    command = " ".join(["kvmesh bench sync_lag", *(argv if argv is not None else sys.argv[1:])])
    path = write_results(result, args.out, command)
    lag = result["lag_ms"] or {}
    print(f"sync lag over {result['applied']:,} of {result['sent']:,} choices: p50 {lag.get('p50')} ms, p90 "
          f"{lag.get('p90')} ms, p99 {lag.get('p99')} ms; {result['lost']} lost; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
