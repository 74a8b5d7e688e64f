"""A replica killed under streaming load, trial after trial: what status codes and streams clients see.

    kvmesh bench replica-kill [--model ../shared/models/stories260K/hf] [--replicas 2] [--trials 10]
                              [--roles prefill,decode,decode] [--long-prompts] [--concurrency 16] [--duration 8]
                              [--kill-at 3]
                              [--router-cmd CMD]
                              [--out results/replica_kill.json]

Real replicas (``kvmesh replica``, stories260K on CPU) and ``kvmesh router`` in front of them, each its own
process, as an operator runs them. Each trial keeps ``--concurrency`` streaming completions in flight for
``--duration`` seconds and SIGKILLs, ``--kill-at`` seconds in, the replica with the most requests in
flight (the one decoding most streams; with ``--roles``, a prefill replica is never the one); then restarts it on the
same ports and waits until the router
has it back. Counted per trial and in all: HTTP status codes, streams that ended with ``[DONE]`` and no
error, error events, broken streams, and answers whose text names a Python exception (internals leaking);
with the router's retries and stream migrations (what it did so that clients saw nothing). The
criterion: no 5xx, every stream served. Results go to a JSON file; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.faults import _metric
from kvmesh.cluster.measure.benchmarks.support.json_http import call
from kvmesh.cluster.measure.benchmarks.support.kill_fleet import (
    ReplicaProcess,
    replica_rows,
    start_router,
    wait_all_healthy,
)
from kvmesh.cluster.measure.shared_dir import stories_model

PROMPTS = [f"Once upon a time, {who} went to the {where} and" for who in ("Lily", "Tom", "a little dog", "Ben")
           for where in ("park", "sea", "shop", "forest")]
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her big red ball. "
         "One day, she saw a dog in the park and the dog wanted to play with the ball too. Lily was happy to share, "
         "and they played together until the sun went down. ")
LONG = STORY * 4
"""About 300 tokens of stories260K: with a number in front of it, a prompt long enough for a P/D split."""
SPLIT_OK = 'kvmesh_router_pd_splits_total{outcome="ok"}'
"""Prompts prefilled on a prefill replica and decoded on another (the router's metric)."""
LEAK = re.compile(r"\b\w*(Error|Exception)\b|Traceback|TCPTransport|0x[0-9a-f]{6,}")
"""What a Python exception's text looks like in an answer (a 5xx or an error event must not carry one)."""


async def stream_once(session, url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: its HTTP status and how it ended."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    out: dict = {"status": None, "ended": "broken", "leak": None}
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            out["status"] = r.status
            if r.status != 200:
                text = (await r.read()).decode(errors="replace")
                out["ended"], out["leak"] = f"HTTP {r.status}", _leak(text)
                out["message"] = text[:200]
                return out
            error = None
            async for raw in r.content:
                line = raw.decode(errors="replace").strip()
                if line == "data: [DONE]":
                    out["ended"] = "error event" if error else "done"
                    return out
                if line.startswith("data: ") and '"error"' in line:
                    error = line[6:206]
                    out["message"], out["leak"] = error, _leak(line)
    except Exception as e:  # noqa: BLE001 - a client-side failure is a result here
        out["ended"], out["message"] = "client error", f"{type(e).__name__}: {e}"[:200]
    return out


def _leak(text: str) -> str | None:
    found = LEAK.search(text)
    return found.group(0) if found else None


async def load(url: str, args, stop_at: float) -> list[dict]:
    import aiohttp

    results: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=args.client_timeout)

    async def client(i: int) -> None:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            n = i
            while time.monotonic() < stop_at:
                prompt = f"{n} {LONG}" if args.long_prompts else PROMPTS[n % len(PROMPTS)]
                results.append(await stream_once(session, url, prompt, args.max_tokens))
                n += args.concurrency

    await asyncio.gather(*(client(i) for i in range(args.concurrency)))
    return results


def trial(index: int, url: str, replicas: list[ReplicaProcess], args) -> dict:
    """One load with one kill; the killed replica restarted and back in rotation at the end."""
    before = call("GET", url + "/metrics", timeout=10.0).text

    async def run() -> tuple[list[dict], str]:
        t0 = time.monotonic()
        running = asyncio.ensure_future(load(url, args, t0 + args.duration))
        await asyncio.sleep(args.kill_at)
        rows = await asyncio.to_thread(replica_rows, url)
        decoding = [r for r in replicas if r.role != "prefill"]
        busiest = max(decoding, key=lambda r: rows.get(r.name, {}).get("in_flight", 0))
        busiest.kill()
        return await running, busiest.name

    results, killed = asyncio.run(run())
    after = call("GET", url + "/metrics", timeout=10.0).text
    victim = next(r for r in replicas if r.name == killed)
    victim.start()
    back_s = wait_all_healthy(url, [victim.proc], len(replicas), args.restart_timeout)
    statuses = Counter(str(r["status"]) for r in results)
    ends = Counter(r["ended"] for r in results)
    leaks = [r for r in results if r["leak"]]
    out = {
        "trial": index, "killed": killed, "requests": len(results), "status_codes": dict(sorted(statuses.items())),
        "ended": dict(sorted(ends.items())), "http_5xx": sum(n for s, n in statuses.items() if s.startswith("5")),
        "leaking_answers": len(leaks),
        "retries": _metric(after, "kvmesh_router_retries_total") - _metric(before, "kvmesh_router_retries_total"),
        "migrations": (_metric(after, "kvmesh_router_stream_migrations_total")
                       - _metric(before, "kvmesh_router_stream_migrations_total")),
        "pd_splits": _metric(after, SPLIT_OK) - _metric(before, SPLIT_OK),
        "restarted_and_back_s": round(back_s, 1),
        "failure_examples": sorted({r.get("message", r["ended"]) for r in results if r["ended"] != "done"})[:3],
    }
    print(f"  trial {index}: killed {killed}; {out['requests']} streams {out['ended']} statuses {out['status_codes']}"
          f" retries {out['retries']:.0f} migrations {out['migrations']:.0f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvmesh bench replica-kill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(stories_model()), help="the replicas' model (default: stories260K)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--roles", default=None,
                    help="each replica's role, comma-separated (e.g. prefill,decode,decode: a P/D split with KV "
                         "transfer; the killed one is a decoding replica); default: every replica both")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=16, help="streams kept in flight")
    ap.add_argument("--long-prompts", action="store_true",
                    help="distinct ~300-token prompts (uncached: what a P/D split takes) instead of 16 short ones")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of load per trial")
    ap.add_argument("--kill-at", type=float, default=3.0, help="seconds into each trial's load")
    ap.add_argument("--client-timeout", type=float, default=120.0)
    ap.add_argument("--restart-timeout", type=float, default=180.0, help="for a replica to start and be healthy")
    ap.add_argument("--router-cmd", default=f"{sys.executable} -m kvmesh.cluster.cli router",
                    help="command that starts the router (another build's, to compare)")
    ap.add_argument("--out", default="results/replica_kill.json")
    args = ap.parse_args(argv)
    if not Path(args.model).is_dir():
        ap.error(f"model directory {args.model} not found (needs ../shared beside the checkout)")
    roles = args.roles.split(",") if args.roles else ["both"] * args.replicas
    replicas = [ReplicaProcess(args.model, f"r{i}", role) for i, role in enumerate(roles)]
    router = None
    trials: list[dict] = []
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            r.listening(args.restart_timeout)
        router, url = start_router(args.router_cmd, args.model, replicas, args.restart_timeout)
        for i in range(1, args.trials + 1):
            trials.append(trial(i, url, replicas, args))
    finally:
        for proc in [router, *(r.proc for r in replicas)]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    total = Counter()
    for t in trials:
        total.update(t["status_codes"])
    summary = {"trials": len(trials), "requests": sum(t["requests"] for t in trials),
               "status_codes": dict(sorted(total.items())), "http_5xx": sum(t["http_5xx"] for t in trials),
               "streams_not_done": sum(t["requests"] - t["ended"].get("done", 0) for t in trials),
               "leaking_answers": sum(t["leaking_answers"] for t in trials),
               "retries": sum(t["retries"] for t in trials), "migrations": sum(t["migrations"] for t in trials),
               "pd_splits": sum(t["pd_splits"] for t in trials)}
    result = {"benchmark": "replica-kill", "command": "kvmesh bench replica-kill " + " ".join(argv or sys.argv[1:]),
              "config": {k: v for k, v in vars(args).items() if k != "out"}, "machine": {"cpus": os.cpu_count()},
              **summary, "per_trial": trials}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    return 0 if summary["http_5xx"] == summary["streams_not_done"] == summary["leaking_answers"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
