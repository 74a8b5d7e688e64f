"""``kvmesh bench compare-policies``: the same workloads through the router under several policies.

For each policy a router is started in this process (``RouterServer``, ephemeral port) in front
of the *same* replicas, and each workload is sent through it; every (policy, workload) run uses
its own ``cache_salt``, so no run reuses cache entries an earlier run left behind. Replicas come
from ``--replica`` (``URL[,events=tcp://H:P][,replay=tcp://H:P][,name=ID]``) or are discovered
from a running router's ``GET /replicas`` (``--url``, e.g. the one ``kvmesh serve`` started). Against a
``kvmesh serve`` running here, the routers take its router's credentials from the cluster's record (its replicas
answer their own router only, and publish their events to it alone): the internal key, the CURVE keys.
With ``--endpoint NAME=URL`` nothing is started: already-running endpoints are compared.
With ``--router NAME`` (repeatable) each router runs as a process of its own, kvmesh's and the peers' (vllm-router,
sglang-router) alike, in front of the same replicas (``--launch-replicas N`` starts them), over ``--rounds``
interleaved rounds, each run on reset prefix caches (live_compare.py, live_routers.py).

Writes one JSON with every run and a side-by-side plot per workload.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import secrets
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvmesh.cluster.config.flags import config_from_args
from kvmesh.cluster.measure.loadgen.load import add_load_arguments, results_dir, run_parameters
from kvmesh.cluster.measure.loadgen.options import BENCH_LOAD_SCHEMA, BenchLoadConfig
from kvmesh.router.config import ReplicaSpec

if TYPE_CHECKING:
    from kvmesh.cluster.admin_key import RouterSecrets


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench compare-policies", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_arguments(p)
    c = p.add_argument_group("comparison")
    c.add_argument("--policies", default="cache_aware,round_robin", help="comma-separated (default: %(default)s)")
    c.add_argument("--workloads", default="chatbot,multi_turn",
                   help="registered workloads (listed below), comma-separated (default: %(default)s)")
    c.add_argument("--replica", action="append", default=[], metavar="SPEC",
                   help="replica URL[,events=tcp://H:P][,replay=tcp://H:P][,name=ID] (repeatable); "
                        "default: GET --url/replicas")
    c.add_argument("--endpoint", action="append", default=[], metavar="NAME=URL",
                   help="compare running endpoints instead of starting routers (repeatable)")
    c.add_argument("--router-model", default=None,
                   help="tokenizer/model path for the started routers (default: the replicas' model id)")
    c.add_argument("--block-size", type=int, default=None,
                   help="the replicas' KV block size (default: the --url cluster's record's, else 16)")
    c.add_argument("--settle", type=float, default=1.0, help="seconds to let a new router sync events")
    r = p.add_argument_group("routers as processes (instead of --policies)")
    r.add_argument("--router", action="append", default=[], metavar="NAME",
                   help="kvmesh (its default policy), kvmesh:POLICY (kvmesh:POLICY@K=V: with a knob, @--flag=V: "
                        "with a router flag), vllm-router, "
                        "vllm-router:kv_aware, sglang-router (repeatable; the peers' cache_aware at their CLI "
                        "defaults)")
    r.add_argument("--launch-replicas", type=int, default=0, metavar="N",
                   help="start N `kvmesh replica`s of --router-model for the comparison (default: --replica)")
    r.add_argument("--replica-args", default="", help="more flags for the launched replicas, e.g. "
                                                      "'--kv-cache-memory 2MiB'")
    r.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    r.add_argument("--peers-dir", default=None, help="folder of the peers' virtualenvs (default: $KVMESH_PEERS_DIR, "
                                                     "else ../peers beside the checkout)")
    r.add_argument("--admin-key", default=None, help="the replicas' admin key, for POST /reset_prefix_cache")
    p.set_defaults(out=str(results_dir() / "bench_compare.json"))
    return p


async def _discover(args: argparse.Namespace, url: str) -> list[ReplicaSpec]:
    from kvmesh.cluster.measure.loadgen.client import HTTP_ERRORS, get_json, open_session

    if args.replica:
        return [ReplicaSpec.parse(s) for s in args.replica]
    from kvmesh.cluster.admin_key import find_admin_key

    try:  # the replica list names the replicas' URLs: the admin plane's (the record of a serve running here)
        admin_key = find_admin_key(url)[1]
    except ValueError as e:
        raise ValueError(f"cannot list replicas at {url}: {e}; or pass --replica URL,events=...,replay=...") from None
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        async with open_session(url, headers, total_s=5.0) as client:
            status, body = await get_json(client, "/replicas")
    except HTTP_ERRORS as e:
        raise ValueError(f"cannot list replicas at {url}/replicas ({type(e).__name__}: {e}); is "
                         "`kvmesh serve` running? Or pass --replica URL,events=...,replay=...") from None
    if status != 200 or not isinstance(body, dict):
        raise ValueError(f"GET {url}/replicas answered {status}; pass --replica specs")
    specs = [ReplicaSpec(url=r["url"], events=r.get("events"), replay=r.get("replay"),
                         replica_id=r.get("id") or "") for r in body["replicas"]]
    if not specs:
        raise ValueError(f"{url} has no replicas registered")
    return specs


def _cluster_secrets(url: str) -> RouterSecrets | None:
    """The router credentials in the record of the ``kvmesh serve`` running here at ``url``; None: none."""
    from kvmesh.cluster.admin_key import running_record

    record = running_record(url)
    return record.router_secrets if record is not None else None


async def _model_id(url: str, api_key: str | None) -> str | None:
    from kvmesh.cluster.measure.loadgen.client import HTTP_ERRORS, get_json, open_session

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with open_session(url, headers, total_s=5.0) as client:
            card = (await get_json(client, "/v1/models"))[1]["data"][0]
            return card.get("root") or card["id"]  # the path it loads from (shown to the cluster's key), else its name
    except (*HTTP_ERRORS, TypeError, KeyError, IndexError):
        return None


async def _server_info(url: str, api_key: str | None) -> dict:
    """A replica's ``GET /server_info`` (its block size and context); empty where it has none."""
    from kvmesh.cluster.measure.loadgen.client import HTTP_ERRORS, get_json, open_session

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with open_session(url, headers, total_s=5.0) as client:
            status, body = await get_json(client, "/server_info")
    except HTTP_ERRORS:
        return {}
    return body if status == 200 and isinstance(body, dict) else {}


async def _wait_healthy(url: str, timeout_s: float = 30.0) -> None:
    from kvmesh.cluster.measure.loadgen.client import HTTP_ERRORS, open_session

    async with open_session(url, total_s=2.0) as client:
        for _ in range(int(timeout_s / 0.2)):
            try:
                async with client.get("/health") as resp:
                    if resp.status == 200:
                        return
            except HTTP_ERRORS:
                pass
            await asyncio.sleep(0.2)
    raise ValueError(f"router at {url} reported no healthy replica within {timeout_s:.0f} s")


async def _run_workloads(args: argparse.Namespace, config: BenchLoadConfig, label: str, url: str,
                         workloads: list[str], nonce: str) -> dict:
    from kvmesh.cluster.measure.loadgen.load import run_bench

    out = {}
    for workload in workloads:
        run = replace(config, endpoint=replace(config.endpoint, url=url),
                      workload=replace(config.workload, workload=workload))
        out[workload] = await run_bench(run, f"{label}/{workload}", not args.no_progress,
                                        cache_salt=f"compare-{nonce}-{label}-{workload}")
    return out


async def compare(args: argparse.Namespace) -> dict:
    config: BenchLoadConfig = config_from_args(args, BENCH_LOAD_SCHEMA)
    api_key = config.endpoint.api_key
    policies = [p for p in args.policies.split(",") if p]
    workloads = [w for w in args.workloads.split(",") if w]
    nonce = secrets.token_hex(4)
    runs: dict[str, dict] = {}
    if args.endpoint:
        for item in args.endpoint:
            name, sep, url = item.partition("=")
            if not sep:
                raise ValueError(f"--endpoint {item!r}: expected NAME=URL")
            runs[name] = await _run_workloads(args, config, name, url, workloads, nonce)
        return runs
    from kvmesh.router.config import RouterConfig, UpstreamConfig
    from kvmesh.router.control.router_server import RouterServer
    from kvmesh.router.routing.kv_placement import KVPlacementRules

    specs = await _discover(args, config.endpoint.url)
    cluster = _cluster_secrets(config.endpoint.url)
    replica_key = cluster.internal_key if cluster is not None and cluster.internal_key else api_key
    model = args.router_model or await _model_id(specs[0].url, replica_key)
    for policy in policies:
        router_config = RouterConfig(host="127.0.0.1", port=0, model=model, policy=policy,
                                     block_size=args.block_size or 16,
                                     upstream=UpstreamConfig(replica_api_key=api_key),
                                     transfers=KVPlacementRules(peer_pulls=False))  # policies alone are compared
        if cluster is not None:  # a `kvmesh serve` cluster: its replicas take its router's credentials only
            router_config = cluster.apply(router_config)
            if args.block_size:
                router_config = replace(router_config, block_size=args.block_size)
        server = RouterServer(router_config, [copy.copy(s) for s in specs]).start()
        try:
            await _wait_healthy(server.url)
            await asyncio.sleep(args.settle)
            runs[policy] = await _run_workloads(args, config, policy, server.url, workloads, nonce)
        finally:
            server.stop()
    return runs


async def _compare_routers(args: argparse.Namespace) -> dict:
    """``--router``: the fleet launched (``--launch-replicas``) or given (``--replica``), then every router over it."""
    from kvmesh.cluster.measure.loadgen.live_compare import compare_routers
    from kvmesh.cluster.measure.loadgen.live_replicas import launched_replicas
    from kvmesh.cluster.measure.loadgen.live_routers import LiveFleet

    config: BenchLoadConfig = config_from_args(args, BENCH_LOAD_SCHEMA)
    workloads = [w for w in args.workloads.split(",") if w]
    if args.launch_replicas:
        if not args.router_model:
            raise ValueError("--launch-replicas needs --router-model (the model the replicas serve)")
        with launched_replicas(args.launch_replicas, args.router_model, args.replica_args) as fleet:
            return await compare_routers(args, config, fleet, args.router, workloads)
    if not args.replica or not args.router_model:
        raise ValueError("--router needs --launch-replicas N or --replica specs, and --router-model")
    specs = tuple(ReplicaSpec.parse(s) for s in args.replica)
    name = await _model_id(specs[0].url, config.endpoint.api_key) or args.router_model
    info = await _server_info(specs[0].url, config.endpoint.api_key)
    fleet = LiveFleet(specs, args.router_model, name, args.block_size or int(info.get("block_size") or 16),
                      info.get("max_model_len"))
    return await compare_routers(args, config, fleet, args.router, workloads)


def _main_routers(args: argparse.Namespace, argv: list[str]) -> int:
    import json
    import shlex

    from kvmesh.cluster.measure.loadgen.live_compare import plot, table

    result = {"command": "kvmesh bench compare-policies " + shlex.join(argv),
              **asyncio.run(_compare_routers(args))}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    written = [str(out)] + ([] if args.no_plot else [str(plot(result, out.with_suffix(".png")))])
    print("wrote " + ", ".join(written))
    return 0 if all(s["errors"] == 0 for per in result["stats"].values() for s in per.values()) else 1


def main(argv: list[str] | None = None) -> int:
    from kvmesh.cluster.measure.loadgen.client import EndpointUnreachable
    from kvmesh.cluster.measure.loadgen.plots import plot_compare
    from kvmesh.cluster.measure.loadgen.report import format_summary, write_json
    from kvmesh.cluster.measure.workloads.traces import TraceError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        if args.router:
            return _main_routers(args, argv)
        runs = asyncio.run(compare(args))
    except (EndpointUnreachable, TraceError, ValueError) as e:
        print(f"kvmesh bench compare-policies: {e}", file=sys.stderr)
        return 2
    table = {name: {w: r["summary"] for w, r in per.items()} for name, per in runs.items()}
    out = write_json({"summaries": table, "runs": runs}, args.out)
    written = [str(out)]
    workloads = sorted({w for per in table.values() for w in per})
    for w in workloads:
        for name in table:
            if w in table[name]:
                print(format_summary(f"{name:>14} {w}", table[name][w]))
        if not args.no_plot:
            path = Path(args.out).with_name(f"{Path(args.out).stem}_{w}.png")
            first = next(iter(runs.values()))[w]["config"]
            written.append(str(plot_compare({n: table[n][w] for n in table if w in table[n]},
                                            f"policies on {w}", path, params=run_parameters(first))))
    print("wrote " + ", ".join(written))
    return 0 if all(s["ok"] for per in table.values() for s in per.values()) else 1
