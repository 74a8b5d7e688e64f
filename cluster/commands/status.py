"""``kvmesh status``: the router's replicas, their roles, health, KV usage, hit rates, KV transfers and event lag.

ROLE is prefill, decode or both; PULLS are the KV pulls a replica made from a peer (a prefill replica's hand-over,
or a peer's prefix), with failed ones in brackets; MOVED the KV bytes it pulled; "-" where the replica has no
KV transfer counters (a server of another kind, or its /metrics did not answer). Under the table, the live
single-pool ceiling: the fleet's hits as a share of one pool of its blocks, and its misses by kind
(cluster/ceiling_status.py). Below, when the router admits
(router.admission), a row per tenant and priority: requests waiting in the router's queue now, that waited,
admitted, answered 429 by reason, their time to first token (streams, queue included) and the tenant's tokens."""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("status", help="show a running cluster's replicas (via its router)",
                                   description=__doc__)
    parser.add_argument("--url", default=None,
                        help="router URL (default: the one kvmesh serve running here, else http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=None,
                        help="router API key (default: $KVMESH_API_KEY, else the record of the kvmesh serve "
                             "running here at --url)")
    parser.add_argument("--admin-key-file", default=None,
                        help="file holding the admin key, or a cluster record, for the replica list (default: "
                             "$KVMESH_ADMIN_KEY, else the record of the kvmesh serve running here at --url)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--deployment", default=None,
                        help="only this deployment's replicas (a cluster of several models; needs the admin key)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    import aiohttp
    from kvmesh.cluster.ceiling_status import ceiling_figures, ceiling_line
    from kvmesh.cluster.router_client import RouterClient
    from kvmesh.cluster.tenant_status import format_tenants, tenant_rows

    try:
        args.url, admin_key = _locate(args.url, args.admin_key_file)
    except ValueError as e:
        print(f"kvmesh status: {e}", file=sys.stderr)
        return 2
    client = RouterClient(args.url, api_key=_api_key(args), admin_key=admin_key)
    try:
        rows = client.status()
        text = client.metrics_text()
        tenants, ceiling = tenant_rows(text), ceiling_figures(text)
        health = client.health()
        fleet = _fleet(client)
    except aiohttp.ClientResponseError as e:
        hint = {401: " (set --api-key or KVMESH_API_KEY)",
                403: " (the replica list needs the cluster's admin key: run status as the user whose kvmesh serve "
                     "runs here, or set KVMESH_ADMIN_KEY)"}.get(e.status, "")
        print(f"kvmesh status: router at {args.url} answered {e.status}{hint}", file=sys.stderr)
        return 1
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        print(f"kvmesh status: no router at {args.url} ({type(e).__name__}); is `kvmesh serve` running? "
              "Pass --url for another address.", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.deployment is not None:
        try:
            rows = of_deployment(rows, fleet, args.deployment)
        except ValueError as e:
            print(f"kvmesh status: {e}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({"router": args.url, "health": health, "fleet": fleet,
                          "replicas": [{**_row_dict(r), "hit_rate": r.hit_rate, "host_hit_rate": r.host_hit_rate}
                                       for r in rows],
                          "tenants": [_row_dict(t) for t in tenants], "single_pool_ceiling": ceiling}, indent=2))
        return 0
    print(format_table(rows, args.url, health))
    print(ceiling_line(ceiling))
    if tenants:
        print(format_tenants(tenants))
    if fleet:
        print(format_fleet(fleet))
    return 0


def of_deployment(rows: list, fleet: dict | None, deployment: str) -> list:
    """The rows of ``deployment``'s replicas (``GET /admin/fleet``'s ``deployments``); ValueError when the cluster
    runs no deployments (or the fleet could not be read) or none of that name."""
    owners = (fleet or {}).get("deployments")
    if not owners:
        raise ValueError(f"--deployment {deployment}: this cluster runs no deployments (or its fleet could not be "
                         "read: it needs the admin key)")
    if deployment not in owners.values():
        raise ValueError(f"no deployment {deployment!r}; this cluster runs {', '.join(sorted(set(owners.values())))}")
    return [r for r in rows if owners.get(r.replica_id) == deployment]


def _locate(url: str | None, key_file: str | None = None) -> tuple[str, str | None]:
    """The router's URL -- the one cluster running here when none is given (ValueError listing them when
    several run) -- and, when this user has it (its serve runs here, ``key_file``, $KVMESH_ADMIN_KEY), its
    admin key: the replica list needs it (it names the replicas' URLs), and status then shows scaling."""
    import os

    from kvmesh.cluster.admin_key import find_admin_key, running_clusters

    if url is None and len(running_clusters()) > 1 and not os.environ.get("KVMESH_ADMIN_KEY"):
        find_admin_key(None)  # raises: which clusters run, and --url to pick one
    try:
        return find_admin_key(url, key_file)
    except ValueError:
        if key_file:
            raise
        return url or "http://127.0.0.1:8000", None


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else $KVMESH_API_KEY, else the key in the record of the cluster at ``args.url`` (its serve
    runs here as this user)."""
    from kvmesh.cluster.admin_key import running_record

    if args.api_key or os.environ.get("KVMESH_API_KEY"):
        return args.api_key or os.environ.get("KVMESH_API_KEY")
    record = running_record(args.url)
    return record.api_key if record is not None else None


def _fleet(client) -> dict | None:
    import aiohttp

    try:
        return client.fleet()
    except aiohttp.ClientResponseError:  # no admin key, or a standalone router (501)
        return None


def format_fleet(fleet: dict) -> str:
    auto = fleet["autoscale"]
    prefill = sum(role == "prefill" for role in (fleet.get("roles") or {}).values())
    have = f" ({prefill} prefill)" if prefill else ""
    want = f" + {fleet['prefill_target']} prefill" if fleet.get("prefill_target") else ""
    lines = [f"fleet: {len(fleet['replicas'])} replicas{have}, target {fleet['target']}{want}"
             + (f", autoscale {auto['min_replicas']}..{auto['max_replicas']} at {auto['target_in_flight']:g} in "
                "flight/replica" if auto["enabled"] else ", autoscale off")
             + (f"; now: {fleet['busy']}" if fleet["busy"] else "")]
    for d in fleet["decisions"][-5:]:
        lines.append(f"  decision: {d['action']} {d['current']} -> {d['target']} ({d['reason']})"
                     + (f", drain {d['victim']}" if d["victim"] else ""))
    for op in fleet["operations"][-5:]:
        lines.append(f"  done: {op['operation']} in {op['seconds']}s: {op['outcome']}")
    return "\n".join(lines)


def _row_dict(row) -> dict:
    return {name: getattr(row, name) for name in row.__slots__}


def format_table(rows, url: str, health: dict) -> str:
    header = ("REPLICA", "ROLE", "HEALTH", "KV USE", "HOST USE", "INDEX BLK", "RUN", "WAIT", "ROUTED", "HIT RATE",
              "HOST HIT", "PULLS", "MOVED", "EVENT LAG", "GAPS", "BAD FRAMES", "URL")
    lines = [header]
    for r in rows:
        lines.append((r.replica_id, r.role or "-", _health(r), f"{r.kv_usage:.0%}",
                      f"{r.host_kv_usage:.0%}" if r.num_host_kv_blocks else "-", str(r.index_blocks),
                      str(r.num_running), str(r.num_waiting), str(r.requests_routed),
                      "-" if r.hit_rate is None else f"{r.hit_rate:.0%}",
                      "-" if r.host_hit_rate is None else f"{r.host_hit_rate:.0%}", _pulls(r),
                      "-" if r.kv_pulls is None else _bytes(r.kv_pulled_bytes),
                      "-" if r.event_lag_s is None else f"{r.event_lag_s * 1e3:.1f} ms", str(r.event_gaps),
                      str(r.event_bad_frames), r.url))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                      for line in lines)
    shown = {r.replica_id for r in rows}  # --deployment: its replicas only
    healthy = len([rid for rid in health.get("healthy_replicas", []) if rid in shown])
    notes = [f"  {r.replica_id}: routed by load only -- {r.degraded}" for r in rows if r.healthy and r.degraded]
    notes += [f"  {r.replica_id}: ejected after failures in a row -- {r.last_failure}" for r in rows if r.ejected]
    return "\n".join([f"router {url}: {healthy}/{len(rows)} replicas healthy", table, *notes])


def _pulls(row) -> str:
    if row.kv_pulls is None:
        return "-"
    return f"{row.kv_pulls}" + (f" ({row.kv_pulls_failed} failed)" if row.kv_pulls_failed else "")


def _bytes(n: int) -> str:
    """1023 B, 1.5 KiB, 12.0 MiB, 3.2 GiB."""
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def _health(row) -> str:
    if row.draining:  # out of rotation on purpose, its running requests finishing
        return "draining"
    if row.ejected:  # outlier detection: back after its ejection and an answered probe request
        return f"EJECTED {row.ejected_for_s:.0f}s" if row.ejected_for_s else "EJECTED (probing)"
    if not row.healthy:
        return "DOWN"
    return "degraded" if row.degraded else "ok"
