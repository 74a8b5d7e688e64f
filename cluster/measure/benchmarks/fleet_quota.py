"""A tenant's token-rate limit through 1, 2 and 4 routers: the rate it is served, a light tenant's latency beside it.

    kvmesh bench fleet_quota                          # results/fleet_quota.json: 100 tokens/s through 1, 2, 4 routers
    kvmesh bench fleet_quota --routers 2 --window-s 10 --out /tmp/fleet_quota.json

Emulated replicas (``kvmesh replica --emulate h100-8b``: real tokens through the router's whole path, no model run)
and the largest N of ``kvmesh router`` processes on loopback sharing one state directory, so their tenants' token
totals meet in its quota.sqlite3 (router/control/quota_sync.py); a run through N uses the first N routers and a
heavy tenant of its own (its bucket full at the start). The heavy tenant (``--tokens-per-s``, ``--burst-tokens``) floods
every router (support/quota_load.py: each request with another ``user``, a 429 retried after 0.1 s); once its burst is
spent its served tokens are counted over ``--window-s``. The verdict: each rate within ``--tolerance`` of the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.quota_fleet import QuotaFleet, heavy_key, write_keys
from kvmesh.cluster.measure.benchmarks.support.quota_load import LoadSettings, flood, light_alone
from kvmesh.cluster.measure.benchmarks.support.work_dir import in_work_dir, write_results


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvmesh bench fleet_quota", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routers", default="1,2,4", help="router counts, comma-separated")
    ap.add_argument("--replicas", type=int, default=2, help="emulated replicas behind the routers")
    ap.add_argument("--tokens-per-s", type=float, default=100.0, help="the heavy tenant's limit")
    ap.add_argument("--burst-tokens", type=float, default=200.0, help="its bucket")
    ap.add_argument("--clients", type=int, default=8, help="the heavy tenant's clients, spread over the routers")
    ap.add_argument("--window-s", type=float, default=30.0, help="seconds its served tokens are counted over")
    ap.add_argument("--light-alone-s", type=float, default=5.0, help="the light tenant alone first (0: not)")
    ap.add_argument("--tolerance", type=float, default=0.10, help="the verdict's bound, a fraction of the limit")
    ap.add_argument("--router-arg", action="append", default=[], help="one more flag for every router (repeatable)")
    ap.add_argument("--work", default=None, help="keep the processes' logs in this folder (default: a temporary one)")
    ap.add_argument("--out", default="results/fleet_quota.json")
    return ap


def _ms(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    return round(1000 * statistics.quantiles(samples, n=100)[int(q) - 1], 1) if len(samples) > 1 else samples[0] * 1000


def table(result: dict) -> str:
    """The runs as a Markdown table (``kvmesh bench report``'s ``fleet_quota`` kind)."""
    limit = result["setup"]["tokens_per_s"]
    lines = [f"| routers | heavy tenant (limit {limit:g}/s) | from its start | 429s | light p50 / p90 beside it | "
             "alone |", "|---|---|---|---|---|---|"]
    for r in result["runs"]:
        beside, alone = r["light_beside_ms"], r["light_alone_ms"]
        lines.append(f"| {r['routers']} | {r['rate_tokens_per_s']:.1f} tokens/s | {r['from_start_tokens_per_s']:.1f} "
                     f"| {r['shed_429']} | {beside['p50']} / {beside['p90']} ms | {alone['p50']} / {alone['p90']} ms |")
    return "\n".join(lines)


def run(args: argparse.Namespace, work: Path) -> dict:
    fleet = QuotaFleet(work, args.replicas)
    runs = [int(x) for x in args.routers.split(",")]
    keys = write_keys(work, runs, args.tokens_per_s, args.burst_tokens)
    result: dict = {"setup": {"tokens_per_s": args.tokens_per_s, "burst_tokens": args.burst_tokens,
                              "replicas": args.replicas, "clients": args.clients, "window_s": args.window_s,
                              "tolerance": args.tolerance}, "runs": []}
    t0 = time.monotonic()
    try:
        fleet.start_replicas()
        print(f"[{time.monotonic() - t0:5.1f}s] {args.replicas} emulated replicas up", flush=True)
        urls = fleet.start_routers(max(runs), keys, work / "state", args.router_arg)
        print(f"[{time.monotonic() - t0:5.1f}s] {max(runs)} routers serving, one state directory", flush=True)
        for n in runs:
            settings = LoadSettings(model=fleet.model, heavy_key=heavy_key(n), clients=args.clients,
                                    window_s=args.window_s)
            result["runs"].append(measure(urls[:n], settings, args))
            got = result["runs"][-1]
            print(f"[{time.monotonic() - t0:5.1f}s] {n} router(s): {got['rate_tokens_per_s']:.1f} tokens/s (limit "
                  f"{args.tokens_per_s:g}; from the start {got['from_start_tokens_per_s']:.1f}), {got['shed_429']} x "
                  f"429, light p50 {got['light_beside_ms']['p50']} ms (alone {got['light_alone_ms']['p50']})",
                  flush=True)
    finally:
        fleet.stop()
    result["ok"] = all(r["within"] for r in result["runs"]) and bool(result["runs"])
    return result


def measure(urls: list[str], settings: LoadSettings, args: argparse.Namespace) -> dict:
    """One run through ``urls``: the light tenant alone, then the heavy one's flood beside it."""
    alone = asyncio.run(light_alone(urls, settings, args.light_alone_s)) if args.light_alone_s else []
    got = asyncio.run(flood(urls, settings))
    light = got.pop("light")
    got["light_alone_ms"] = {"p50": _ms(alone, 50), "p90": _ms(alone, 90), "n": len(alone)}
    got["light_beside_ms"] = {"p50": _ms(light, 50), "p90": _ms(light, 90), "n": len(light)}
    got["within"] = abs(got["rate_tokens_per_s"] - args.tokens_per_s) <= args.tolerance * args.tokens_per_s
    return got


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = in_work_dir(args.work, "kvmesh-fleet-quota-", lambda work: run(args, work))
    out = write_results(result, args.out,
                        "kvmesh bench fleet_quota " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"{'PASS' if result['ok'] else 'FAIL'}: each rate within {args.tolerance:.0%} of {args.tokens_per_s:g} "
          f"tokens/s; written to {out}")
    return 0 if result["ok"] else 1
