"""Routers on several Ray nodes, one of them killed mid-run: hit rate against one router, failures, rejoin.

    kvmesh bench multi-router [--nodes 2] [--routers 3] [--replicas 2] [--workload azure_code] [--requests 300]
                              [--trials 3] [--concurrency 6]
                              [--model ../shared/models/stories260K/hf] [--out results/multi_router.json]

Ray nodes on this machine stand in for hosts (support/ray_nodes.py: a head and worker raylets, each with its own
CPUs and a router resource); ``kvmesh serve --address`` joins them with ``--num-routers`` routers placed on the
nodes (no shared memory, no shared file) and stories260K replicas on CPU. A shared trace's first ``--requests``
records (``--workload``), rendered as token ids, are replayed on the same replicas, each run under its own
``cache_salt`` so no run reuses another's blocks:

- ``one``: every request through router 0;
- ``spread``: request i through router i mod N (``one`` and ``spread`` repeated ``--trials`` times, interleaved;
  their hit rates are the trials' mean);
- ``sessions``: conversations whose next turn reaches another router than the first (did it find the replica
  that holds the first turn?);
- a drain sent to a placed router (answered by serve, the owner of the replica set: a 421 naming it);
- ``kill``: spread again; when a third of the requests are out, router 1's process is SIGKILLed. A client whose
  router refuses or drops its connection sends the request to the next router. Ray restarts the router on its node;
  the run measures when it answers a completion again, and, once the requests are done, that every router's view
  of every replica is back to nothing in flight, nothing running and no prefill queued (the dead router's
  bookings expired);
- then the conversations' third turns go through the restarted router (its index rebuilt from the replicas'
  replay and snapshot: did each find its replica?).

Written to ``--out``: hit rates, failures per router, the fail-fast times, the rejoin time and the settle time.
Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.ray_nodes import (
    NAMESPACE,
    SERVED_NAME,
    LocalNodes,
    PlacedServe,
)
from kvmesh.cluster.measure.benchmarks.support.spread_client import (
    REQUEST_TIMEOUT_S,
    Request,
    replay,
    send,
)
from kvmesh.cluster.measure.benchmarks.support.spread_views import RouterViews, merged, summary
from kvmesh.cluster.measure.shared_dir import stories_model

KILLED = 1
"""The router the ``kill`` run kills."""
MAX_TOKENS = 4
"""Tokens each request generates (the runs measure routing, not decoding)."""
SESSION_FIRST_TOKENS = 64
"""A conversation's first prompt (4 blocks of 16 tokens); its next turn adds half as many."""
BLOCK_SIZE = 16
NEXT_TURN_AFTER_S = 0.2
"""Seconds between an answer and the conversation's next turn (a person or an agent reads it first); the answer's
blocks reach every router's index on the replica's event stream meanwhile."""


TRACES = ("azure_code", "azure_conv", "mooncake")
"""Workloads read from the shared traces (cluster/measure/workloads/registry.py)."""


def trace_requests(workload: str, num: int, num_routers: int) -> list[tuple[list[int], int]]:
    """A shared trace's first ``num`` records as token-id prompts (stories260K's vocabulary, 16 tokens per trace
    block), with the router each goes to in a spread run."""
    from kvmesh.cluster.measure.loadgen.load import build_sessions
    from kvmesh.cluster.measure.loadgen.options import BenchLoadConfig, WorkloadOptions
    from kvmesh.cluster.measure.workloads.prompts import PromptMaker

    config = BenchLoadConfig(workload=WorkloadOptions(workload=workload, num_requests=num))
    sessions = build_sessions(config, PromptMaker())
    return [(list(s.turns[0].user), i % num_routers) for i, s in enumerate(sessions)]


def conversations(count: int = 12) -> list[list[list[int]]]:
    """``count`` conversations of three turns as token-id prompts, each turn extending the last."""
    import random

    rng = random.Random(0)
    out = []
    for _ in range(count):
        turns = [[rng.randrange(3, 512) for _ in range(SESSION_FIRST_TOKENS)]]
        for _ in range(2):
            turns.append(turns[-1] + [rng.randrange(3, 512) for _ in range(SESSION_FIRST_TOKENS // 2)])
        out.append(turns)
    return out


async def send_turn(urls, model: str, talks: list[list[list[int]]], turn: int, router_of) -> int:
    """Turn ``turn`` of every conversation, conversation i through router ``router_of(i)``; how many found the
    replica that holds the turn before (its full blocks cached), through the prefix index every router builds from
    the replicas' events."""
    found = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as http:
        for i, talk in enumerate(talks):
            answer = await send(http, urls, Request(talk[turn], 1, router_of(i)), "sessions", model)
            found += turn > 0 and answer.cached_tokens >= len(talk[turn - 1]) - BLOCK_SIZE
    return found


async def _run(views: RouterViews, prompts: list[tuple[list[int], int]], concurrency: int, model: str,
               trials: int) -> dict:
    one = [Request(p, MAX_TOKENS, 0) for p, _ in prompts]
    spread = [Request(p, MAX_TOKENS, r) for p, r in prompts]
    runs: dict[str, list[dict]] = {"one": [], "spread": []}
    for trial in range(trials):  # interleaved, each under its own salt: the same replicas, cold for each run
        for name, requests in (("one", one), ("spread", spread)):
            runs[name].append(summary(await replay(views.urls, requests, f"{name}-{trial}", model, concurrency)))
    results: dict = {name: merged(found) for name, found in runs.items()}

    talks, routers = conversations(), len(views.urls())
    await send_turn(views.urls, model, talks, 0, lambda i: i % routers)
    await asyncio.sleep(NEXT_TURN_AFTER_S)
    results["sessions"] = {"conversations": len(talks), "next_turn_found_its_replica": await send_turn(
        views.urls, model, talks, 1, lambda i: (i + 1) % routers)}
    results["owner_request_status"] = await views.owner_request_status()
    killed_at: list[float] = []

    def kill_when_due(i: int) -> None:
        if not killed_at and i >= len(spread) // 3:
            os.kill(views.pid(KILLED), signal.SIGKILL)
            killed_at.append(time.monotonic())

    rejoin = asyncio.create_task(views.wait_rejoined(KILLED, killed_at, model))
    outcomes = await replay(views.urls, spread, "kill", model, concurrency, on_sent=kill_when_due)
    results["kill"] = summary(outcomes, killed=KILLED)
    results["kill"]["rejoined_s"] = await rejoin
    results["kill"]["settled_s"] = await views.wait_settled()
    results["sessions"]["after_restart_found_its_replica"] = await send_turn(  # its index: replay and snapshot
        views.urls, model, talks, 2, lambda i: KILLED)
    for name in ("spread", "kill"):  # hit rate points against one router on the same replicas and trace
        results[name]["gap_points"] = round(100 * (results[name]["hit_rate"] - results["one"]["hit_rate"]), 2)
    return results


def table(result: dict) -> str:
    """The runs as a Markdown table (``kvmesh bench report``'s ``multi_router`` kind), then the kill's outcome."""
    s, kill = result["setup"], result["kill"]
    rows = ["| run | requests | answered | failed | moved to another router | hit rate (per trial) | vs one router |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, what in (("one", "all through router 0"), ("spread", f"spread over {s['routers']}"),
                       ("kill", f"spread, router {s['killed_router']} killed")):
        r = result[name]
        gap = f"{r['gap_points']:+.2f} pt" if "gap_points" in r else "—"
        each = ", ".join(f"{100 * h:.2f}" for h in r.get("hit_rates", ()))
        rows.append(f"| {what} | {r['requests']} | {r['ok']} | {r['failed']} | "
                    f"{r['moved']} | {100 * r['hit_rate']:.2f}%{f' ({each})' if each else ''} | {gap} |")
    back = f"{kill['rejoined_s']:.1f} s" if kill["rejoined_s"] is not None else "not within the wait"
    fast = f"{1000 * kill['failed_fast_max_s']:.0f} ms" if kill["failed_fast_max_s"] is not None else "—"
    turns = result["sessions"]
    return "\n".join(rows) + (
        f"\n\n{s['routers']} routers on {s['nodes']} Ray nodes, {s['replicas']} {s['model']} replicas on CPU, "
        f"{s['trace']}, {s['concurrency']} in flight. The killed router answered again {back} after the kill; its "
        f"clients' failed attempts took at most {fast}; {turns['next_turn_found_its_replica']} of "
        f"{turns['conversations']} conversations' next turns, sent to another router, found their replica, and "
        f"{turns.get('after_restart_found_its_replica', '—')} of their third turns through the restarted router. "
        f"Requests "
        f"that failed through the routers not killed: {kill['failed_through_others']}.")


def _started_serve(address: str, model: str, args: argparse.Namespace, work: Path) -> PlacedServe:
    """``kvmesh serve`` ready on the nodes; started once more when its first start fails (a loaded machine can miss
    a start-up deadline, as Ray's own raylet registration can), the first failure printed."""
    for attempt in (1, 2):
        (work / f"start-{attempt}").mkdir()
        serve = PlacedServe(address, model, args.replicas, args.routers, work / f"start-{attempt}",
                            args.ready_timeout_s)
        try:
            serve.wait_ready(args.ready_timeout_s)
            return serve
        except RuntimeError as e:
            serve.stop()
            if attempt == 2:
                raise
            print(f"kvmesh bench multi-router: serve did not start; starting it once more:\n{e}", file=sys.stderr)
    raise AssertionError("unreachable")


def run(args: argparse.Namespace) -> dict:
    import ray

    model = str(args.model or stories_model() or "")
    if not model:
        raise SystemExit("no stories260K model found (pass --model DIR)")
    prompts = trace_requests(args.workload, args.requests, args.routers)
    nodes = LocalNodes(args.nodes, args.cpus_per_node, routers_per_node=args.routers)
    serve = None
    try:
        with tempfile.TemporaryDirectory(prefix="kvmesh-multi-router-") as work:
            serve = _started_serve(nodes.address, model, args, Path(work))
            ray.init(address=nodes.address, namespace=NAMESPACE, log_to_driver=False)
            views = RouterViews(serve, args.replicas)
            views.refresh()
            started = time.monotonic()
            results = asyncio.run(_run(views, prompts, args.concurrency, SERVED_NAME, args.trials))
            results["wall_s"] = round(time.monotonic() - started, 1)
            serve.stop()
    finally:
        if serve is not None:
            serve.stop()
        if ray.is_initialized():
            ray.shutdown()
        nodes.shutdown()
    results["setup"] = {"nodes": args.nodes, "routers": args.routers, "replicas": args.replicas,
                        "requests": len(prompts), "trials": args.trials, "concurrency": args.concurrency,
                        "max_tokens": MAX_TOKENS,
                        "model": "stories260K", "trace": f"{args.workload} (first records)", "killed_router": KILLED}
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench multi-router", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2, help="Ray nodes on this machine (default: %(default)s)")
    ap.add_argument("--cpus-per-node", type=int, default=2, help="logical CPUs of each node (default: %(default)s)")
    ap.add_argument("--routers", type=int, default=3, help="routers placed on the nodes (default: %(default)s)")
    ap.add_argument("--replicas", type=int, default=2, help="stories260K replicas (default: %(default)s)")
    ap.add_argument("--workload", choices=TRACES, default="azure_code",
                    help="shared trace replayed (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=300, help="trace records replayed per run (default: %(default)s)")
    ap.add_argument("--trials", type=int, default=3,
                    help="times the one-router and spread runs are repeated, each under its own salt (default: "
                         "%(default)s)")
    ap.add_argument("--concurrency", type=int, default=6, help="requests in flight (default: %(default)s)")
    ap.add_argument("--model", default=None, help="model directory (default: the shared stories260K)")
    ap.add_argument("--ready-timeout-s", type=float, default=300.0,
                    help="longest wait for serve (default: %(default)s)")
    ap.add_argument("--out", default="results/multi_router.json")
    args = ap.parse_args(argv)
    if args.nodes < 2 or args.routers < 2 or not 1 <= args.requests <= 5000 or args.concurrency < 1 \
            or not 1 <= args.trials <= 10:
        ap.error("--nodes and --routers must be at least 2, --requests 1..5000, --concurrency at least 1, "
                 "--trials 1..10")
    results = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"wrote {args.out}")
    return 0
