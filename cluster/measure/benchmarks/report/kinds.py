"""The kinds of generated table ``kvmesh bench report`` knows (the package's ``render`` rewrites the blocks), each
the renderer of one kind of results file:

``sim``: one ``kvmesh sim`` report, a row per policy; ``matrix``: ``kvmesh bench policy_matrix``'s cells and the
default policy's verdict in each; ``route_scaling``: ``kvmesh bench route_scaling``'s CPU per decision by fleet size;
``router_peers``: ``kvmesh bench router-peers``' CPU per request, a row per router run; ``live_routers``: ``kvmesh
bench compare-policies --router ...``'s routers in front of the same replicas, cached share and TTFT over rounds;
``fp8_kv_cache``: ``kvmesh bench fp8-kv-cache``'s blocks per GiB, agreement and simulated hit rate per KV cache dtype;
``spec_decode``: ``kvmesh bench spec-decode``'s tokens per second and acceptance, a row per workload; ``fp8_aot``:
``tests/replica/triton_aot.py --out``'s attention kernels for sm_90 with and without an FP8 cache; ``lora``: a
``kvmesh sim --workload lora`` report, a row per run that served adapters; ``multi_router``: ``kvmesh bench
multi-router``'s runs through one router, spread over several and with one killed; ``fleet_quota``: ``kvmesh bench
fleet_quota``'s tenant rate and a light tenant's latency per router count; ``first_constrained``: a replica's first
constrained request, build against build; ``soak``: ``kvmesh bench soak``'s memory per process from the warm-up mark
to the end and its requests by kind; ``sync_lag``: ``kvmesh bench sync_lag``, from one router's choice to another
applying it.

Kinds that take several files (FILE may be a pattern): ``queue_flood``: ``kvmesh bench queue-flood`` runs, a row per
file; ``replications``: ``kvmesh sim --arrival-seed K`` reports of one comparison, a row per policy with its mean and
95% interval over the seeds; ``matrix_noise``: runs of the policy matrix with every time scale moved a little, the
cells each meets and how far each policy's TTFT moved; ``verdict``: ``kvmesh bench policy_matrix --seeds N``'s cells
(of one file or several runs' files), a row each with its verdict over the seeds and the rivals that fail it or leave
it undecided, with their paired intervals; ``routers_published``: several routers on published loads against one;
``live_verdict``: ``kvmesh bench live_verdict``'s routers on an emulated fleet, a row per file and router,
``live_verdict_itl`` their time between tokens and ``live_verdict_shortfall`` the cells where kvmesh's default misses
its line; ``emulated_fleet``: the emulated fleet against the simulator. And one that reads other files of the
checkout: ``variant_gain``, a variant of the default against the default's own runs of the same seeds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

_BENCH = "kvmesh.cluster.measure.benchmarks"
_SUPPORT = f"{_BENCH}.support"


def _lazy(module: str, name: str = "table") -> Callable[..., str]:
    """The renderer ``module.name``, the module imported when first used (``kvmesh bench report`` renders a few
    kinds; most benchmark modules are heavier to import than the rewrite itself)."""
    return lambda *args: getattr(importlib.import_module(module), name)(*args)


def sim_table(report: dict) -> str:
    """A ``kvmesh sim`` report as a table: the default policy first (bold), then by hit rate."""
    from kvmesh.router.routing.policies import DEFAULT_POLICY

    pool = (report.get("ceilings") or {}).get("single_pool_hit_rate")
    rows = sorted(report["policies"].items(), key=lambda kv: (kv[0] != DEFAULT_POLICY, -kv[1]["hit_rate"]))
    out = ["| policy | prefix hit rate (tokens) | of the single-pool ceiling | TTFT p50 | TTFT p99 | max/mean load |",
           "|---|---|---|---|---|---|"]
    for name, p in rows:
        label = f"**{name}** (the default)" if name == DEFAULT_POLICY else name
        of_pool = f"{100 * p['hit_rate'] / pool:.1f}%" if pool else "-"
        out.append(f"| {label} | {100 * p['hit_rate']:.1f}% | {of_pool} | {p['ttft_s']['p50']:.3f} s | "
                   f"{p['ttft_s']['p99']:.2f} s | {p['load_imbalance']:.2f} |")
    return "\n".join(out)


_SHORT = {"hit_rate": "hit", "ttft_p50": "p50", "ttft_p99": "p99"}


def _gap(metric: str, theirs: float, ours: float) -> str:
    """How far the default is from the better policy: points of hit rate, percent of TTFT."""
    if metric == "hit_rate":
        return f"{100 * (ours - theirs):+.1f} pt"
    return f"{100 * (ours / theirs - 1):+.0f}%"


def matrix_table(data: dict) -> str:
    """``kvmesh bench policy_matrix``'s cells, a row per workload and rate, a column per KV movement: where the
    default falls short beyond the slack, or ok (the verdict recomputed from the figures; - : not run)."""
    from kvmesh.cluster.measure.benchmarks.policy_matrix import count_line, dominance

    default, cells = data["default"], data["cells"]
    kvs = list(dict.fromkeys(key.split("/")[2] for key in cells))
    rows = list(dict.fromkeys("/".join(key.split("/")[:2]) for key in cells))
    out = [f"| workload/rate | {' | '.join(kvs)} |", "|---" * (len(kvs) + 1) + "|"]
    for row in rows:
        marks = []
        for kv in kvs:
            cell = cells.get(f"{row}/{kv}")
            if cell is None:
                marks.append("-")
                continue
            pol = cell["policies"]
            short = ", ".join(f"{_SHORT[metric]} {name} {_gap(metric, theirs, ours)}"
                              for metric, (name, theirs, ours) in dominance(pol, default).items())
            marks.append(short or "ok")
        out.append(f"| {row} | {' | '.join(marks)} |")
    return "\n".join(out) + "\n\n" + count_line(data)


def matrix_noise_table(docs: list[dict]) -> str:
    from kvmesh.cluster.measure.benchmarks.policy_matrix import noise_table

    return noise_table(docs)


def lora_table(report: dict) -> str:
    """A ``kvmesh sim --workload lora`` report's runs that served adapter requests, a row each."""
    lines = ["| run | hit rate | TTFT p50 | TTFT p99 | adapter loads (per adapter request) | passed over for a slot "
             "| adapters per replica |", "|---|---|---|---|---|---|---|"]
    for name, s in report["policies"].items():
        if "lora" in s:
            lo, ttft = s["lora"], s["ttft_s"]
            lines.append(f"| {name.replace('/', ', ')} | {s['hit_rate']:.1%} | {ttft['p50']:.3f} s | {ttft['p99']:.2f} "
                         f"s "
                         f"| {lo['adapter_loads']:,} ({lo['adapter_loads_per_request']:.2f}) | "
                         f"{lo['slot_wait_share']:.1%} | {lo['adapters_per_replica_mean']:.1f} |")
    return "\n".join(lines)


def verdict_table(docs: list[dict]) -> str:
    from kvmesh.cluster.measure.benchmarks.policy_matrix import KV, RATES, WORKLOADS
    from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import merged, table

    return table(merged(docs), len(WORKLOADS) * len(RATES) * len(KV))


RENDERERS: dict[str, Callable[[dict], str]] = {
    "sim": sim_table, "matrix": matrix_table, "lora": lora_table,
    "route_scaling": _lazy(f"{_BENCH}.route_scaling"), "router_peers": _lazy(f"{_BENCH}.router_peers"),
    "fp8_kv_cache": _lazy(f"{_BENCH}.fp8_kv_cache"), "fp8_aot": _lazy(f"{_BENCH}.fp8_kv_cache", "aot_table"),
    "spec_decode": _lazy(f"{_BENCH}.spec_decode"), "live_routers": _lazy("kvmesh.cluster.measure.loadgen.live_compare"),
    "multi_router": _lazy(f"{_BENCH}.multi_router"), "fleet_quota": _lazy(f"{_BENCH}.fleet_quota"),
    "first_constrained": _lazy(f"{_BENCH}.first_constrained"), "soak": _lazy(f"{_BENCH}.soak"),
    "sync_lag": _lazy(f"{_BENCH}.sync_lag")}
"""Kinds whose table comes from one results file."""
MANY_RENDERERS: dict[str, Callable[[list[dict]], str]] = {
    "queue_flood": _lazy(f"{_BENCH}.queue_flood", "table_of"), "matrix_noise": matrix_noise_table,
    "replications": _lazy(f"{_BENCH}.headline"), "verdict": verdict_table,
    "routers_published": _lazy(f"{_SUPPORT}.routers_published_table"),
    "live_verdict": _lazy(f"{_SUPPORT}.live_verdict_table"), "live_verdict_itl": _lazy(f"{_SUPPORT}.live_verdict_itl"),
    "live_verdict_shortfall": _lazy(f"{_SUPPORT}.live_verdict_shortfall"),
    "emulated_fleet": _lazy(f"{_BENCH}.emulated_fleet")}
"""Kinds whose table has a row per results file (FILE may be a pattern)."""
ROOTED_RENDERERS: dict[str, Callable[[list[dict], Path], str]] = {"variant_gain": _lazy(f"{_SUPPORT}.variant_gain")}
"""Kinds whose results files name other results files, read from the checkout (FILE may be a pattern)."""

