"""Routers on several Ray nodes, one of them killed mid-run: hit rate against one router, failures, rejoin, and a
stored Responses conversation that outlives the kill.

    kvmesh bench multi-router [--nodes 2] [--routers 3] [--replicas 2] [--workload azure_code] [--requests 300]
                              [--trials 3] [--concurrency 6] [--responses-dsn postgresql://...]
                              [--model ../shared/models/stories260K/hf] [--out results/multi_router.json]

Ray nodes on this machine stand in for hosts (support/ray_nodes.py: a head and worker raylets, each with its own
CPUs and a router resource, all with one state directory); ``kvmesh serve --address`` joins them with
``--num-routers`` routers placed on the nodes (no shared memory; stored responses in the state directory's SQLite
file) and stories260K replicas on CPU. A shared trace's first ``--requests`` records (``--workload``), rendered as
token ids, are replayed on the same replicas, each run under its own ``cache_salt`` so no run reuses another's
blocks:

- ``one``: every request through router 0;
- ``spread``: request i through router i mod N (``one`` and ``spread`` repeated ``--trials`` times, interleaved;
  their hit rates are the trials' mean);
- ``sessions``: conversations whose next turn reaches another router than the first: did that router's index know
  the replica that holds the first turn (its route receipt's best hit), and was the turn computed there? The two
  differ by the policy alone: while any replica has requests queued or running, the default's turnover term prices an
  uncached token by how much of this router's prefill each replica took lately, evicting or not
  (``CacheAwareTokensConfig.turnover_while_filling``), so a router whose last prompts leaned to the holder can send
  the next turn to the other. Each turn not
  computed on its holder is kept with both turns' route receipts;
- a drain sent to a placed router (answered by serve, the owner of the replica set: a 421 naming it);
- ``responses``: a stored Responses conversation (support/responses_talk.py), turn 1 through router 1, turn 2 by
  ``previous_response_id`` through router 0 on another node;
- ``kill``: spread again; when a third of the requests are out, router 1's process is SIGKILLed. A client whose
  router refuses or drops its connection sends the request to the next router. Ray restarts the router on its node;
  the run measures when it answers a completion again, and, once the requests are done, that every router's view
  of every replica is back to nothing in flight, nothing running and no prefill queued (the dead router's
  bookings expired);
- then the conversations' third turns go through the restarted router (its index rebuilt from the replicas'
  replay and snapshot: did each find its replica?), the Responses conversation's third turn too, and every router
  is asked for each stored response (with its tenant's key, and another tenant's).

``--responses-dsn``: then serve is started again on the same nodes with the routers' stored responses in that
PostgreSQL database (one replica, a router on each of two nodes), for the Responses conversation alone: turns 1
and 2, router 1 killed, turn 3 once it is back, every router asked.

The placed routers sync their choices (``routers.router_sync``, router/control/router_sync.py): each router's stream
counters are read before the kill and at the end (the restarted router's anew, following the others again).

Written to ``--out``: hit rates, failures per router, the fail-fast times, the rejoin time, the settle time, the
conversation's turns (router, node, status, cached tokens), stored responses found and the sync counters. Every
wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.ray_nodes import (
    NAMESPACE,
    SERVED_NAME,
    LocalNodes,
    ServeShape,
    started_serve,
)
from kvmesh.cluster.measure.benchmarks.support.responses_talk import Talk, TalkKeys, conversation_line
from kvmesh.cluster.measure.benchmarks.support.spread_client import Request, replay
from kvmesh.cluster.measure.benchmarks.support.spread_prompts import (
    TRACES,
    conversations,
    send_turn,
    trace_requests,
    turn_summary,
)
from kvmesh.cluster.measure.benchmarks.support.spread_views import RouterViews, merged, summary
from kvmesh.cluster.measure.shared_dir import stories_model
from kvmesh.replica.openai.responses_api.store_config import SQLITE_FILE

KILLED = 1
"""The router the ``kill`` run kills (and that stores the Responses conversation's first turn)."""
OTHER = 0
"""The router of the Responses conversation's second turn: on another node than ``KILLED``."""
MAX_TOKENS = 4
"""Tokens each request generates (the runs measure routing, not decoding)."""
NEXT_TURN_AFTER_S = 0.2
"""Seconds between an answer and the conversation's next turn (a person or an agent reads it first); the answer's
blocks reach every router's index on the replica's event stream meanwhile."""


async def _replays(views: RouterViews, prompts: list[tuple[list[int], int]], concurrency: int, model: str,
                   trials: int) -> dict:
    """The ``one`` and ``spread`` runs, interleaved, each trial under its own salt (the same replicas, cold for
    each run)."""
    one = [Request(p, MAX_TOKENS, 0) for p, _ in prompts]
    spread = [Request(p, MAX_TOKENS, r) for p, r in prompts]
    runs: dict[str, list[dict]] = {"one": [], "spread": []}
    for trial in range(trials):
        for name, requests in (("one", one), ("spread", spread)):
            outcomes = await replay(views.urls, requests, f"{name}-{trial}", model, concurrency, views.client_headers)
            runs[name].append(summary(outcomes))
    return {name: merged(found) for name, found in runs.items()}


async def _first_turns(views: RouterViews, talk: Talk) -> None:
    """The Responses conversation's turns 1 (through the router to be killed) and 2 (through another node's)."""
    await talk.say(views.urls()[KILLED], KILLED)
    await asyncio.sleep(NEXT_TURN_AFTER_S)
    await talk.say(views.urls()[OTHER], OTHER)


def _kill(views: RouterViews, killed_at: list[float]) -> None:
    """SIGKILL router ``KILLED``'s process (nothing flushed, nothing said goodbye); Ray restarts it."""
    os.kill(views.pid(KILLED), signal.SIGKILL)
    killed_at.append(time.monotonic())


async def _run(views: RouterViews, prompts: list[tuple[list[int], int]], concurrency: int, model: str,
               trials: int, talk: Talk) -> dict:
    results = await _replays(views, prompts, concurrency, model, trials)
    talks, routers, headers = conversations(), len(views.urls()), views.client_headers
    first = await send_turn(views.urls, model, talks, 0, lambda i: i % routers, headers)
    await asyncio.sleep(NEXT_TURN_AFTER_S)
    second = await send_turn(views.urls, model, talks, 1, lambda i: (i + 1) % routers, headers)
    next_turn = turn_summary(talks, 1, second, first)
    results["sessions"] = {"conversations": len(talks), "next_turn_index_knew": next_turn["index_knew"],
                           "next_turn_found_its_replica": next_turn["found"], "next_turn_missed": next_turn["missed"]}
    results["owner_request_status"] = await views.owner_request_status()
    results["sync_before_kill"] = views.sync_counters()  # each router's choices sent to and taken from the others
    await _first_turns(views, talk)
    killed_at: list[float] = []
    spread = [Request(p, MAX_TOKENS, r) for p, r in prompts]

    def kill_when_due(i: int) -> None:
        if not killed_at and i >= len(spread) // 3:
            _kill(views, killed_at)

    rejoin = asyncio.create_task(views.wait_rejoined(KILLED, killed_at, model))
    outcomes = await replay(views.urls, spread, "kill", model, concurrency, headers, on_sent=kill_when_due)
    results["kill"] = summary(outcomes, killed=KILLED)
    results["kill"]["rejoined_s"] = await rejoin
    results["kill"]["settled_s"] = await views.wait_settled()
    third = await send_turn(views.urls, model, talks, 2, lambda i: KILLED, headers)  # its index: replay, snapshot
    after_restart = turn_summary(talks, 2, third, second)
    results["sessions"] |= {"after_restart_index_knew": after_restart["index_knew"],
                            "after_restart_found_its_replica": after_restart["found"],
                            "after_restart_missed": after_restart["missed"]}
    await talk.say(views.urls()[KILLED], KILLED)
    results["responses"] = await talk.check(views.urls())
    results["sync_after_restart"] = views.sync_counters()  # the restarted router's stream, from its restart on
    for name in ("spread", "kill"):  # hit rate points against one router on the same replicas and trace
        results[name]["gap_points"] = round(100 * (results[name]["hit_rate"] - results["one"]["hit_rate"]), 2)
    return results


async def _conversation_alone(views: RouterViews, talk: Talk) -> dict:
    """The Responses conversation alone, router ``KILLED`` killed between its turns 2 and 3 (no replay)."""
    await _first_turns(views, talk)
    killed_at: list[float] = []
    rejoin = asyncio.create_task(views.wait_rejoined(KILLED, killed_at, SERVED_NAME))
    _kill(views, killed_at)
    rejoined_s = await rejoin
    await talk.say(views.urls()[KILLED], KILLED)
    return {**await talk.check(views.urls()), "rejoined_s": rejoined_s}


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


def _router_settings(work: Path, client_key: str, keys: TalkKeys, dsn: str | None) -> dict:
    """The routers' keys (the clients' API key; the keys file of the conversation's tenant and another) and their
    database of stored responses (PostgreSQL when ``dsn`` is given, else the state directory's SQLite file)."""
    work.mkdir(parents=True, exist_ok=True)
    keys_file = work / "keys.json"
    keys_file.write_text(json.dumps({"keys": [{"key": keys.owner, "tenant": "owner"},
                                              {"key": keys.stranger, "tenant": "stranger"}]}))
    keys_file.chmod(0o600)
    return {"api_key": client_key, "admission": {"keys_file": str(keys_file)},
            **({"responses": {"dsn": dsn}} if dsn else {})}


def _served(address: str, shape: ServeShape, work: Path, keys: TalkKeys,
            runs: Callable[[RouterViews, Talk], Awaitable[dict]]) -> dict:
    """One ``kvmesh serve`` on the nodes: started, ``runs`` through its routers, stopped."""
    serve = started_serve(address, shape, work)
    try:
        views = RouterViews(serve, shape.replicas, shape.router["api_key"])
        views.refresh()
        started = time.monotonic()
        results = asyncio.run(runs(views, Talk(SERVED_NAME, keys, serve.router_node)))
        results["wall_s"] = round(time.monotonic() - started, 1)
        return results
    finally:
        serve.stop()


def _on_nodes(args: argparse.Namespace, model: str, prompts: list[tuple[list[int], int]], work: Path) -> dict:
    """The nodes; serve on them for the runs (its routers' responses in the nodes' state directory), then, given
    ``--responses-dsn``, serve again with them in PostgreSQL for the Responses conversation alone."""
    import ray

    client_key, keys = secrets.token_urlsafe(16), TalkKeys(secrets.token_urlsafe(16), secrets.token_urlsafe(16))
    state = work / "state"

    def shape(name: str, replicas: int, routers: int, dsn: str | None) -> ServeShape:
        return ServeShape(model, replicas, routers, args.ready_timeout_s,
                          _router_settings(work / name, client_key, keys, dsn), state, f"{NAMESPACE}-{name}")

    nodes = LocalNodes(args.nodes, args.cpus_per_node, routers_per_node=args.routers, state_dir=state)
    try:
        ray.init(address=nodes.address, namespace=NAMESPACE, log_to_driver=False)
        results = _served(nodes.address, shape("sqlite", args.replicas, args.routers, None), work / "sqlite", keys,
                          lambda views, talk: _run(views, prompts, args.concurrency, SERVED_NAME, args.trials, talk))
        results["responses"].update(store="SQLite", in_state_dir=(state / SQLITE_FILE).is_file())
        if args.responses_dsn:  # the least that shows it: one replica, a router on each of two nodes
            results["responses_postgres"] = _served(nodes.address, shape("postgres", 1, 2, args.responses_dsn),
                                                    work / "postgres", keys, _conversation_alone)
            results["responses_postgres"]["store"] = "PostgreSQL"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        nodes.shutdown()
    return results


def run(args: argparse.Namespace) -> dict:
    model = str(args.model or stories_model() or "")
    if not model:
        raise SystemExit("no stories260K model found (pass --model DIR)")
    prompts = trace_requests(args.workload, args.requests, args.routers)
    with tempfile.TemporaryDirectory(prefix="kvmesh-multi-router-") as work:
        results = _on_nodes(args, model, prompts, Path(work))
    results["setup"] = {"nodes": args.nodes, "routers": args.routers, "replicas": args.replicas,
                        "requests": len(prompts), "trials": args.trials, "concurrency": args.concurrency,
                        "max_tokens": MAX_TOKENS, "model": "stories260K", "trace": f"{args.workload} (first records)",
                        "killed_router": KILLED}
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
    ap.add_argument("--responses-dsn", default=None,
                    help="PostgreSQL connection string: after the runs, serve again with the routers' stored "
                         "responses there, for the Responses conversation and its kill alone (default: none)")
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
    for name in ("responses", "responses_postgres"):
        if name in results:
            print(conversation_line(results[name], KILLED))
    print(f"wrote {args.out}")
    return 0
