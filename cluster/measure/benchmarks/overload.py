"""A light tenant, a flooding tenant and a high-priority class against a live cluster, and a verdict.

    kvmesh bench overload [--replicas 2 | --pd] [--workers 2] [--url URL] [--out results/bench_overload.json]

Starts its own cluster (``kvmesh replica`` processes of stories260K on CPU with ``--max-num-seqs 4`` and
``kvmesh router`` in front, loopback, free ports; support/overload_cluster.py) unless ``--url`` names one. Then:

  alone      the light tenant alone: one streamed request every ``--light-period-s`` -> its TTFT p50 alone
  flood      ``--flood-clients`` clients of the flooding tenant (closed loop, ``--flood-tokens`` each, a 429 makes a
             client wait its Retry-After) for ``--flood-s``, the light tenant still sending every period -> its TTFT
             p90 under the flood, every flood request's outcome (200 / 429: how fast, Retry-After? / 5xx / timeout)
             and the cluster's capacity (flood requests completed per second once the flood is under way)
  overload   per level in ``--levels`` (2,4): arrivals evenly spaced at level x capacity for ``--overload-s``, one in
             1/``--high-share`` from the high-priority class (``priority`` ``--high-priority``), the rest bulk from the
             flooding tenant (``--low-priority``; at most ``--max-in-flight`` of them in flight) -> the high class's
             TTFT p90 against ``--high-target-s``

Tenants are named by an API key (``--tenant-key``/``--keys-file``), else by ``user`` (its own router's user tenants).
Requests still waiting ``--drain-s`` after their phase ends are cancelled (counted); between phases the driver
waits until the router has nothing in flight. Prints progress, a table and the acceptance verdict; writes every
request and summary to ``--out`` with a plot beside it (.png). Ctrl-C stops the cluster and writes what it has.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support import overload_load
from kvmesh.cluster.measure.benchmarks.support import overload_report as rep
from kvmesh.cluster.measure.benchmarks.support.json_http import call
from kvmesh.cluster.measure.benchmarks.support.overload_cluster import (
    Cluster,
    ClusterShape,
    metric_sum,
    wait_idle,
)
from kvmesh.cluster.measure.benchmarks.support.overload_keys import load_tenant_keys
from kvmesh.cluster.measure.benchmarks.support.overload_options import build_parser


async def _progress(driver: overload_load.Driver, every_s: float, state: dict) -> None:
    while every_s > 0:
        await asyncio.sleep(every_s)
        recs = [r for r in driver.records if r["phase"] == state["phase"]]
        outcomes = {}
        for r in recs:
            if r["outcome"] != "pending":
                outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        light = [r["ttft_s"] for r in recs if r["cls"] in ("light", "high") and r["ttft_s"] is not None]
        print(f"  [{time.monotonic() - driver.t0:6.1f} s] {state['phase']}: sent {len(recs)}, in flight "
              f"{driver.in_flight}, {outcomes}" + (f", last light/high TTFT {light[-1]:.3f} s" if light else ""),
              flush=True)


async def drive(args, driver: overload_load.Driver, cluster: Cluster | None, info: dict) -> None:
    """Run the phases; what is measured besides the records goes into ``info`` as it is known."""
    keys = load_tenant_keys(args.tenant_key, args.keys_file)
    light, flood, high = (overload_load.LoadTenant(u, keys.get(u)) for u in (args.light_user, args.flood_user,
                                                                             args.high_user))
    prio = None if args.priority_in == "none" else args.priority_in
    hi_p, lo_p = (args.high_priority, args.low_priority) if prio else (None, None)
    state = {"phase": "warmup"}
    times, cpu = info.setdefault("phase_times", {}), info.setdefault("cpu", {})
    now = time.monotonic
    async with overload_load.open_session() as session:
        progress = asyncio.ensure_future(_progress(driver, args.progress_s, state))
        try:
            for _ in range(2):  # first requests load lazily built state; not measured
                await driver.one(session, "warmup", "light", light, args.light_tokens)

            async def phase(name: str, body) -> None:
                state["phase"] = name
                print(f"phase {name} ...", flush=True)
                t0, c0, d0 = now(), cluster.cpu_seconds() if cluster else 0.0, sum(os.times()[:2])
                times[name] = {"start": round(t0 - driver.t0, 3)}
                await body()
                times[name]["end"] = round(now() - driver.t0, 3)
                done = sum(r["outcome"] == "ok" for r in driver.records if r["phase"] == name)
                spent = cluster.cpu_seconds() - c0 if cluster else None
                cpu[name] = {"wall_s": round(now() - t0, 2), "ok_requests": done,
                             "driver_cpu_s": round(sum(os.times()[:2]) - d0, 2),
                             "cluster_cpu_s": None if spent is None else round(spent, 2),
                             "cluster_cpu_ms_per_ok_request": round(1e3 * spent / done, 1) if spent and done else None}
                times[name]["idle_wait_s"] = round(await asyncio.to_thread(wait_idle, cluster, 60.0, args.settle_s), 2)

            def lights(name: str, until: float):
                return overload_load.ticker(args.light_period_s, until,
                                 lambda: driver.one(session, name, "light", light, args.light_tokens))

            async def alone() -> None:
                await overload_load.settle(await lights("alone", now() + args.alone_s), args.client_timeout_s)

            async def flooding() -> None:
                until = now() + args.flood_s
                ticking = asyncio.ensure_future(lights("flood", until))
                await overload_load.closed_loop(args.flood_clients, until, lambda: driver.one(
                    session, "flood", "flood", flood, args.flood_tokens), args.retry_after_cap_s)
                await overload_load.settle(await ticking, args.client_timeout_s)

            await phase("alone", alone)
            await phase("flood", flooding)
            info["capacity_rps"], info["capacity_source"] = (
                (args.capacity, "--capacity") if args.capacity else (capacity(driver.records, times["flood"]), "flood"))
            print(f"capacity: {info['capacity_rps']:.2f} requests/s ({info['capacity_source']})", flush=True)
            every = max(1, round(1 / args.high_share))
            for level in _levels(args.levels):
                name = rep.level_phase(level)

                def send(i: int, name=name):
                    if i % every == 0:
                        return driver.one(session, name, "high", high, args.flood_tokens, hi_p)
                    return driver.one(session, name, "bulk", flood, args.flood_tokens, lo_p)

                def refuse(i: int, name=name) -> None:
                    overload_load.not_sent(driver, name, "bulk")

                async def overload(level=level, send=send, refuse=refuse) -> None:
                    tasks = await overload_load.open_loop(level * info["capacity_rps"], now() + args.overload_s, send,
                                               lambda i: i % every == 0 or driver.in_flight < args.max_in_flight,
                                               refuse)
                    await overload_load.settle(tasks, args.drain_s)

                await phase(name, overload)
        finally:
            progress.cancel()


def capacity(records: list[dict], span: dict) -> float:
    """Flood requests completed (200, stream done) per second, from a third of the flood (at most 5 s) to its end."""
    start = span["start"] + min(5.0, (span["end"] - span["start"]) / 3)
    done = [r for r in records if r["phase"] == "flood" and r["cls"] == "flood" and r["outcome"] == "ok"
            and start <= r["t"] + r["e2e_s"] <= span["end"]]
    return max(len(done), 1) / max(span["end"] - start, 1e-3)


def _levels(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def result_doc(args, argv: list[str], shape: ClusterShape, driver: overload_load.Driver, info: dict,
               interrupted: bool) -> dict:
    records = [{**r, "outcome": "cancelled"} if r["outcome"] == "pending" else r  # only when interrupted
               for r in driver.records if r["phase"] != "warmup"]
    return {
        "benchmark": "overload", "command": " ".join(["kvmesh bench overload", *argv]), "interrupted": interrupted,
        "variant": {"label": ("url" if args.url else shape.label.lstrip("_") or "1replica"), "url": args.url,
                    "replicas": 2 if shape.pd else shape.replicas, "workers": shape.workers, "pd": shape.pd},
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "tenant_key")},
        "machine": {"cpus": os.cpu_count(), "nice": os.nice(0), "loadavg_start": info.get("loadavg_start"),
                    "loadavg_end": list(os.getloadavg())},
        "capacity_rps": info.get("capacity_rps"), "capacity_source": info.get("capacity_source"),
        "phase_times": info.get("phase_times", {}), "cpu": info.get("cpu", {}), "router": info.get("router", {}),
        "phases": rep.by_phase_and_class(records),
        "verdict": rep.verdict(records, _levels(args.levels), args.high_target_s),
        "requests": records,
    }


class RunTerminated(KeyboardInterrupt):
    """SIGTERM: the run stops as on Ctrl-C (the cluster stopped, the results written), exit code 143."""


def _terminated(signum, frame) -> None:
    raise RunTerminated


def _user_tenants(args) -> list[str]:
    """Its own router's flags: tenants by ``user`` under its one shared key, allowed the bench's priorities."""
    return ["--admission-user-tenants", "--admission-shared-min-priority", str(min(0, args.high_priority,
                                                                                   args.low_priority))]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(__doc__).parse_args(argv)
    policy = [] if args.scheduling_policy == "none" else ["--scheduling-policy", args.scheduling_policy]
    shape = ClusterShape(model=args.model, replicas=args.replicas, workers=args.workers, pd=args.pd,
                         max_num_seqs=args.max_num_seqs, replica_args=policy + args.replica_arg,
                         router_args=_user_tenants(args) + args.router_arg, cli=shlex.split(args.kvmesh_cmd))
    if not args.url and not Path(args.model).is_dir():
        print(f"kvmesh bench overload: model directory {args.model} not found (../shared beside the checkout, "
              "or $KVMESH_SHARED_DIR, or --model)", file=sys.stderr)
        return 2
    try:
        load_tenant_keys(args.tenant_key, args.keys_file)
    except ValueError as e:
        print(f"kvmesh bench overload: {e}", file=sys.stderr)
        return 2
    if args.url:
        args.url = args.url.rstrip("/")
        try:
            call("GET", args.url + "/v1/models", timeout=5.0)
        except OSError as e:
            print(f"kvmesh bench overload: cannot reach {args.url} ({e}); is the router running?", file=sys.stderr)
            return 2
    out = Path(args.out or f"results/bench_overload{'_url' if args.url else shape.label}.json")
    cluster = None if args.url else Cluster(shape)
    driver = overload_load.Driver(url=args.url or "", client_timeout_s=args.client_timeout_s,
                                  priority_in=args.priority_in,
                       priority_header=args.priority_header)
    info: dict = {"loadavg_start": list(os.getloadavg())}
    interrupted = 0  # the exit code of a run stopped by a signal
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if cluster:
            print(f"starting {len(shape.roles)} replica(s) {shape.roles}, router --workers {shape.workers} ...",
                  flush=True)
            driver.url = cluster.start()
        before = cluster.metrics() if cluster else ""
        driver.t0 = time.monotonic()
        asyncio.run(drive(args, driver, cluster, info))
        if cluster:
            after = cluster.metrics()
            info["router"] = {m: metric_sum(after, m) - metric_sum(before, m)
                              for m in ("kvmesh_router_pd_splits_total", "kvmesh_router_retries_total")}
    except KeyboardInterrupt as e:
        interrupted = 143 if isinstance(e, RunTerminated) else 130
        print("interrupted: stopping the cluster, writing what was measured", file=sys.stderr, flush=True)
    except RuntimeError as e:
        print(f"kvmesh bench overload: {e}", file=sys.stderr)
        return 1
    finally:
        if cluster:
            for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not leave processes behind
                signal.signal(sig, signal.SIG_IGN)
            cluster.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    result = result_doc(args, argv, shape, driver, info, bool(interrupted))
    print(rep.format_table(result["phases"]))
    print(rep.format_verdict(result["verdict"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(rep.result_text(result))
    from kvmesh.cluster.measure.benchmarks.support.overload_plot import plot

    plot(result, str(out.with_suffix(".png")))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return interrupted or (0 if result["verdict"]["pass"] else 1)
