"""A queue no tenant can fill: a tenant that retries at once against a light one, through the router's bounded queue.

    kvmesh bench queue-flood [--replicas 2] [--workers 1] [--max-queued 8] [--url URL] [--out FILE]
    kvmesh bench queue-flood --table results/bench_queue_flood*.json      # the markdown table of result files

Starts its own cluster (``kvmesh replica`` processes of stories260K on CPU with ``--max-num-seqs 4``, ``kvmesh
router --admission-max-queued N --admission-user-tenants`` in front: tenants by ``user``) unless ``--url`` names
a router (then ``--flood-key``/``--light-key`` name the tenants by Bearer key). For ``--seconds``: ``--clients``
clients of the flooding tenant, each sending again the moment it gets an answer, a 429 included; the light tenant
sends one ``--light-tokens`` request every ``--period-s`` (support/queue_flood_load.py).

Verdict: the light tenant gets >= 90% of its requests served with p90 latency <= 2 s, and the flooding tenant's
share of the replicas' work (prompt tokens x1, output x2, of the requests served) is no more than its fair share
(max-min: the light tenant is owed what it asked for, up to half). Writes every request and the summary to
``--out``. Exit code 0 when the verdict passes, 1 when not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.overload_cluster import Cluster, ClusterShape
from kvmesh.cluster.measure.benchmarks.support.overload_load import LoadTenant
from kvmesh.cluster.measure.benchmarks.support.peer_load import tree_cpu_seconds
from kvmesh.cluster.measure.benchmarks.support.queue_flood_load import FloodPlan, FloodRun, summarize
from kvmesh.cluster.measure.shared_dir import stories_model

LIGHT_SERVED, LIGHT_P90_S = 0.90, 2.0
"""The acceptance: the light tenant's share of requests served, and its p90 latency."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvmesh bench queue-flood", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="drive this running router instead of starting a cluster")
    ap.add_argument("--model", default=str(stories_model()), help="the replicas' model (default: stories260K)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="router processes (router --workers)")
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--max-queued", type=int, default=8, help="the router's --admission-max-queued")
    ap.add_argument("--kvmesh-cmd", default=f"{sys.executable} -m kvmesh.cluster.cli",
                    help="the command that starts replicas and the router (another build's, to compare)")
    ap.add_argument("--router-arg", action="append", default=[], metavar="ARG",
                    help="extra flag for the router (repeatable; e.g. --router-arg=--admission-admit-ttft-s=1)")
    ap.add_argument("--clients", type=int, default=24, help="the flooding tenant's clients")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--alone-s", type=float, default=5.0, help="the light tenant alone first, this long")
    ap.add_argument("--period-s", type=float, default=0.3, help="the light tenant sends one request this often")
    ap.add_argument("--light-tokens", type=int, default=8)
    ap.add_argument("--flood-tokens", type=int, default=64)
    ap.add_argument("--flood-key", default=None, help="the flooding tenant's Bearer key (default: user 'flood')")
    ap.add_argument("--light-key", default=None, help="the light tenant's Bearer key (default: user 'light')")
    ap.add_argument("--out", default=None, help="results JSON (default: results/bench_queue_flood[_variant].json)")
    ap.add_argument("--table", nargs="+", metavar="RESULT", help="print the markdown table of these result files")
    return ap


def verdict(summary: dict) -> dict:
    light = summary["light"]
    checks = {
        "light_served": (light["served_fraction"] or 0.0) >= LIGHT_SERVED,
        "light_p90": light["latency_p90_s"] is not None and light["latency_p90_s"] <= LIGHT_P90_S,
        "flood_within_fair_share": (summary["flood_share"] is not None
                                    and summary["flood_share"] <= summary["flood_fair_share"] + 1e-9),
    }
    return {**checks, "pass": all(checks.values())}


def table(paths: list[str]) -> str:
    """One row per result file: the command, what the light tenant got, the flood's 429s, the shares."""
    return table_of([json.loads(Path(path).read_text()) for path in paths])


def table_of(docs: list[dict]) -> str:
    """``table`` of result files already read (``kvmesh bench report``'s ``queue_flood`` tables)."""
    rows = ["| run | light alone p50 / p90 | light served | light p50 / p90 | flood served / 429 | "
            "flood share of work / fair share | CPU s: replicas / router | verdict |",
            "|---|---|---|---|---|---|---|---|"]
    for doc in docs:
        s, light, flood = doc["summary"], doc["summary"]["light"], doc["summary"]["flood"]
        alone, cpu = s.get("light_alone") or {}, doc.get("cpu_seconds") or {}
        fmt = lambda v: "-" if v is None else f"{v:.3f} s"  # noqa: E731
        rows.append(f"| `{doc['command']}` ({doc['label']}) | {fmt(alone.get('latency_p50_s'))} / "
                    f"{fmt(alone.get('latency_p90_s'))} | {light['served']} of {light['sent']} "
                    f"({light['served_fraction']:.0%}) | {fmt(light['latency_p50_s'])} / "
                    f"{fmt(light['latency_p90_s'])} | {flood['served']} / {sum(flood['refused'].values())} | "
                    f"{s['flood_share']:.1%} / {s['flood_fair_share']:.1%} | "
                    f"{cpu.get('replicas', '-')} / {cpu.get('router', '-')} | "
                    f"{'PASS' if doc['verdict']['pass'] else 'FAIL'} |")
    return "\n".join(rows)


def kept_records(records: list[dict]) -> list[dict]:
    """The requests the results file lists: every one but the flood's refusals (tens of thousands; the summary
    counts them by reason), of which the first of each status stays as an example."""
    refusals_seen: set[int] = set()
    kept = []
    for r in records:
        if r["cls"] == "flood" and r["status"] != 200:
            if r["status"] in refusals_seen:
                continue
            refusals_seen.add(r["status"])
        kept.append(r)
    return kept


def _cpu_seconds(cluster: Cluster | None) -> dict[str, float]:
    """CPU seconds so far of the router (its workers included), the replicas (a cluster of ours) and this driver."""
    out = {"driver": time.process_time()}
    if cluster is not None:
        *replicas, router = cluster.procs
        out |= {"router": tree_cpu_seconds(router.pid), "replicas": sum(tree_cpu_seconds(p.pid) for p in replicas)}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if not args.url and not Path(args.model).is_dir():
        print(f"kvmesh bench queue-flood: model directory {args.model} not found (--model)", file=sys.stderr)
        return 2
    shape = ClusterShape(model=args.model, replicas=args.replicas, workers=args.workers,
                         max_num_seqs=args.max_num_seqs, cli=shlex.split(args.kvmesh_cmd),
                         router_args=["--admission-max-queued", str(args.max_queued), "--admission-user-tenants",
                                      *args.router_arg])
    plan = FloodPlan(LoadTenant("flood", args.flood_key), LoadTenant("light", args.light_key), args.clients,
                     args.seconds,
                     args.period_s, args.light_tokens, args.flood_tokens, alone_s=args.alone_s)
    cluster = None if args.url else Cluster(shape)
    try:
        url = args.url.rstrip("/") if args.url else cluster.start()
        print(f"flood: {args.clients} clients retrying at once, light: one request every {args.period_s} s, "
              f"{args.seconds} s ...", flush=True)
        cpu0 = _cpu_seconds(cluster)
        records = asyncio.run(FloodRun(url, plan).run())
        cpu = {k: round(v - cpu0[k], 2) for k, v in _cpu_seconds(cluster).items()}
    finally:
        if cluster:
            cluster.stop()
    summary = summarize(records, args.light_tokens)
    result = {"benchmark": "queue_flood", "command": " ".join(["kvmesh bench queue-flood", *argv]),
              "label": "url" if args.url else f"{args.replicas} replicas, workers {args.workers}",
              "config": {k: v for k, v in vars(args).items() if k not in ("out", "table", "flood_key", "light_key")},
              "machine": {"cpus": os.cpu_count(), "loadavg_end": list(os.getloadavg())},
              "cpu_seconds": cpu, "summary": summary, "verdict": verdict(summary), "requests": kept_records(records)}
    out = Path(args.out or f"results/bench_queue_flood{'_url' if args.url else shape.label}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({**summary, "cpu_seconds": cpu}, indent=1))
    print(f"verdict: {result['verdict']}\nwrote {out}")
    return 0 if result["verdict"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
