"""``kvmesh bench compare-policies --router NAME ...``: routers as processes in front of the same replicas, the same
workloads through each, in interleaved rounds (live_routers.py starts them).

The replicas are warmed up first (the workload's first requests straight to each, not counted). Per round every
router runs once, the order reversed every other round (a drift of the machine's load falls on
all of them alike); before each run the replicas' prefix caches are reset and the router starts afresh, and no
``cache_salt`` is sent (a router that hashes tokens itself, vllm-router's ``kv_aware``, would match no salted
block). The hit rate is the share of prompt tokens the replicas answered as cached (``usage.prompt_tokens_details
.cached_tokens``), TTFT is the client's. ``table`` gives the mean over the rounds with its 95% interval, and kvmesh
against each peer as a paired difference (same round, same trace).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path

from kvmesh.cluster.measure.loadgen.live_routers import (
    LiveFleet,
    peers_dir,
    replica_counters,
    reset_prefix_caches,
    router_command,
)
from kvmesh.cluster.measure.loadgen.options import BenchLoadConfig

REFERENCE = "kvmesh"
"""The router every other is compared with (paired, round by round)."""


async def _tokens_per_word(config: BenchLoadConfig, fleet: LiveFleet) -> BenchLoadConfig:
    """Text prompts rendered alike for every router: the tokens per word measured once, at a replica."""
    from kvmesh.cluster.measure.loadgen.client import measure_tokens_per_word, open_session
    from kvmesh.cluster.measure.workloads.prompts import sample_text

    if config.endpoint.prompt_format != "text" or config.workload.tokens_per_word is not None:
        return config
    async with open_session(fleet.replicas[0].url, read_timeout_s=30) as client:
        tpw = await measure_tokens_per_word(client, fleet.served_model_name, sample_text())
    return replace(config, workload=replace(config.workload, tokens_per_word=tpw or 2.0))


async def _warm_up(config: BenchLoadConfig, fleet: LiveFleet, workload: str, num_requests: int = 16) -> None:
    """The first requests of ``workload`` sent straight to every replica and forgotten: a replica's first steps are
    slower (allocations, first calls), which would fall on whichever router ran first. The replicas warm up
    side by side (a fleet of emulated replicas with second-long prefills would take minutes one by one)."""
    from kvmesh.cluster.measure.loadgen.load import run_bench

    runs = [run_bench(replace(config, endpoint=replace(config.endpoint, url=spec.url),
                              workload=replace(config.workload, workload=workload, num_requests=num_requests),
                              load=replace(config.load, mode="closed", concurrency=4)),
                      f"warm-up {spec.replica_id}", progress=False) for spec in fleet.replicas]
    await asyncio.gather(*runs)


async def compare_routers(args: argparse.Namespace, config: BenchLoadConfig, fleet: LiveFleet,
                          names: list[str], workloads: list[str]) -> dict:
    """Every router in ``names`` over ``args.rounds`` interleaved rounds: the results file's content."""
    from kvmesh.cluster.measure.loadgen.live_routers import running_router
    from kvmesh.cluster.measure.loadgen.load import run_bench

    commands = {name: router_command(name, fleet, peers_dir(args.peers_dir)) for name in names}  # all found first
    config = await _tokens_per_word(config, fleet)
    await _warm_up(config, fleet, workloads[0])
    rows = []
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            reset_prefix_caches(fleet.replicas, args.admin_key)
            with running_router(commands[name], name) as url:
                await asyncio.sleep(args.settle)
                for workload in workloads:
                    run = replace(config, endpoint=replace(config.endpoint, url=url),
                                  workload=replace(config.workload, workload=workload))
                    before = replica_counters(fleet.replicas, args.admin_key)
                    out = await run_bench(run, f"{name}/{workload} round {rnd}", not args.no_progress)
                    after = replica_counters(fleet.replicas, args.admin_key)
                    per_replica = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
                    rows.append({"round": rnd, "router": name, "workload": workload, "summary": out["summary"],
                                 "replicas": per_replica, "ttft_s": request_ttfts(out["requests"]),
                                 **({"ceiling": router_ceiling(url)} if name.startswith(REFERENCE) else {})})
                    print(round_line(rows[-1]), flush=True)
    settings = out["config"] | {"url": None, "label": None}
    return {"routers": {n: " ".join(c) for n, c in commands.items()}, "rounds": args.rounds,
            "replicas": len(fleet.replicas), "block_size": fleet.block_size, "settings": settings,
            "stats": stats(rows, names, workloads), "rows": rows}


def request_ttfts(requests: list[dict]) -> list[float | None]:
    """Each request's TTFT in arrival order, None for a request that failed (goodput counts it as missed)."""
    return [None if r.get("error") else r.get("ttft_s") for r in requests]


def router_ceiling(url: str) -> dict:
    """kvmesh's router's live single-pool ceiling over the requests it routed (router/http/ceiling_metrics.py): the
    hit rate one pool of the fleet's blocks would have had, and the missed prompt tokens by kind."""
    from kvmesh.cluster.measure.loadgen.live_routers import metric_lines

    out: dict = {"miss_tokens": {}}
    for name, labels, value in metric_lines(url + "/metrics"):
        if name == "kvmesh_router_ceiling_hit_ratio":
            out["hit_rate"] = value
        elif name == "kvmesh_router_prompt_miss_tokens_total":
            out["miss_tokens"][labels.get("kind", "")] = value
    return out


def round_line(row: dict) -> str:
    s = row["summary"]
    ttft = s["ttft_s"]
    p50 = f"  p50 {ttft['p50']:.3f} s" if ttft.get("p50") is not None else ""
    timing = f"TTFT mean {ttft['mean']:.3f} s{p50}" if ttft["mean"] is not None else "no TTFT"
    return (f"  round {row['round']} {row['workload']:<10} {row['router']:<22} "
            f"cached {100 * s['cached_token_share']:5.1f}%  {timing}  errors {s['errors']}")


def _figures(row: dict) -> dict[str, float]:
    """One run's figures: the client's, and how unevenly the router spread requests (busiest replica / mean)."""
    summary, counts = row["summary"], [r["requests"] for r in row.get("replicas") or ()]
    return {"hit_rate": summary["cached_token_share"], "ttft_mean_s": summary["ttft_s"]["mean"],
            "ttft_p50_s": summary["ttft_s"]["p50"], "errors": summary["errors"], "requests": summary["requests"],
            "load_imbalance": max(counts) / (sum(counts) / len(counts)) if counts and sum(counts) else float("nan")}


def stats(rows: list[dict], names: list[str], workloads: list[str]) -> dict:
    """Per workload and router: each figure's mean over the rounds and 95% half-width; against the reference,
    the paired differences (hit rate in points, reference minus it; mean TTFT as the reference's / its - 1)."""
    from kvmesh.cluster.measure.loadgen.intervals import interval, known_interval

    out: dict = {}
    for w in workloads:
        per = {n: [_figures(r) for r in sorted(rows, key=lambda r: r["round"])
                   if r["router"] == n and r["workload"] == w] for n in names}
        out[w] = {}
        for n, runs in per.items():
            entry = {k: known_interval([r[k] for r in runs]) for k in ("hit_rate", "ttft_mean_s", "ttft_p50_s",
                                                                       "load_imbalance")}
            entry["errors"] = sum(r["errors"] for r in runs)
            entry["requests"] = sum(r["requests"] for r in runs)
            ref = per.get(REFERENCE)
            if ref is not None and n != REFERENCE and len(ref) == len(runs):
                pairs = list(zip(ref, runs, strict=True))  # the same rounds, in order
                entry["vs_reference"] = {
                    "hit_points": interval([100 * (a["hit_rate"] - b["hit_rate"]) for a, b in pairs]),
                    "ttft_mean_ratio": interval([a["ttft_mean_s"] / b["ttft_mean_s"] - 1 for a, b in pairs])}
            out[w][n] = entry
    return out


def table(result: dict) -> str:
    """The results file as BENCHMARKS' table: a row per workload and router, means over the rounds ± 95%."""
    from kvmesh.cluster.measure.loadgen.intervals import plus_minus

    lines = [f"| workload | router | cached prompt tokens | mean TTFT | TTFT p50 | {REFERENCE} minus it: cached "
             f"(points) | {REFERENCE}'s mean TTFT / its - 1 | busiest replica / mean | errors |", "|---" * 9 + "|"]
    for w, per in result["stats"].items():
        for name, s in per.items():
            vs = s.get("vs_reference")
            label = f"**{name}**" if name == REFERENCE else name
            cmp = (f"{plus_minus(vs['hit_points'], '{:+.1f}')} | "
                   f"{plus_minus(vs['ttft_mean_ratio'], '{:+.1f}', 100, '%')}" if vs else "- | -")
            lines.append(f"| {w} | {label} | {plus_minus(s['hit_rate'], '{:.1f}', 100, '%')} | "
                         f"{plus_minus(s['ttft_mean_s'], '{:.0f}', 1e3, ' ms')} | "
                         f"{plus_minus(s['ttft_p50_s'], '{:.0f}', 1e3, ' ms')} | "
                         f"{cmp} | {plus_minus(s['load_imbalance'], '{:.2f}')} | "
                         f"{s['errors']} of {s['requests']} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """Cached share and mean TTFT per router, a panel pair per workload: the mean over the rounds (bar) and each
    round (dots, TTFT on a log scale: one slow round must not hide the others)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    work = list(result["stats"])
    fig, axes = plt.subplots(len(work), 2, figsize=(11, 3.6 * len(work)), squeeze=False)
    for row, w in zip(axes, work, strict=True):
        names = list(result["stats"][w])
        for ax, key, scale, title in ((row[0], "hit_rate", 100, "cached prompt tokens (%)"),
                                      (row[1], "ttft_mean_s", 1e3, "mean TTFT (ms, log scale)")):
            runs = {n: [scale * _figures(r)[key] for r in result["rows"] if r["router"] == n and r["workload"] == w]
                    for n in names}
            ax.bar(names, [sum(v) / len(v) for v in runs.values()], alpha=0.6,
                   color=["tab:green" if n == REFERENCE else "tab:gray" for n in names])
            for i, n in enumerate(names):
                ax.plot([i] * len(runs[n]), runs[n], "k.", markersize=8)
            ax.set_yscale("log" if key == "ttft_mean_s" else "linear")
            ax.set_title(f"{w}: {title}, {result['rounds']} rounds (dots) and their mean (bar)", fontsize=9)
            ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
