"""The tables of README.md, BENCHMARKS.md and docs/gpu-cluster.md, generated from the results files
of the commands printed above them: every block between

    <!-- table: KIND results/FILE.json -->
    ...
    <!-- /table -->

is rewritten from that file by KIND's renderer (``sim``: one ``kvmesh sim`` report, a row per policy;
``matrix``: ``kvmesh bench policy_matrix``'s cells and the default policy's verdict in each; ``route_scaling``:
``kvmesh bench route_scaling``'s CPU per decision by fleet size; ``router_peers``: ``kvmesh bench router-peers``'
CPU per request, a row per router run; ``live_routers``: ``kvmesh bench compare-policies --router ...``'s
routers in front of the same replicas, cached share and TTFT over rounds; ``fp8_kv_cache``: ``kvmesh bench
fp8-kv-cache``'s blocks per GiB, agreement
and simulated hit rate per KV cache dtype; ``spec_decode``: ``kvmesh bench spec-decode``'s tokens per
second and acceptance, a row per workload; ``fp8_aot``: ``tests/replica/triton_aot.py --out``'s attention
kernels for sm_90 with and without an FP8 cache; ``lora``: a ``kvmesh sim --workload lora`` report,
a row per run that served adapters; ``queue_flood``:
``kvmesh bench queue-flood`` runs, a row per file; ``multi_router``: ``kvmesh bench multi-router``'s runs through
one router, spread over several and with one killed; ``fleet_quota``: ``kvmesh bench fleet_quota``'s tenant rate
and a light tenant's latency per router count; ``soak``: ``kvmesh bench soak``'s memory per process from the
warm-up mark to the end and its requests by kind; ``replications``: ``kvmesh sim --arrival-seed K`` reports of
one comparison, a row per policy with its mean and 95% interval over the seeds; ``matrix_noise``: runs of the policy
matrix with every time scale
moved a little, the cells each meets and how far each policy's TTFT moved; ``verdict``: ``kvmesh bench policy_matrix
--seeds N``'s cells (of one file or several runs' files), a row each with its verdict over the seeds and the rivals that
fail it or leave it undecided,
with their paired intervals; ``live_verdict``: ``kvmesh bench live_verdict``'s routers on an emulated fleet, a row per
file and router, ``live_verdict_itl`` their time between tokens and ``live_verdict_shortfall`` the cells where kvmesh's
default misses its line; ``emulated_fleet``: the emulated fleet against
the simulator). A FILE with ``*`` names every file it matches, in name order
(for the kinds that take several).

    kvmesh bench report            # rewrite every table from its file
    kvmesh bench report --check    # exit 1 naming every table that differs from its file (tests/test_doc_tables.py)
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.policy_matrix import count_line, dominance

DOCS = ("README.md", "BENCHMARKS.md", "docs/gpu-cluster.md", "docs/benchmarks/routing-against-peers.md",
        "docs/multi-host-routers.md", "docs/benchmarks/engine-cpu.md", "docs/benchmarks/several-routers.md",
        "docs/benchmarks/live-verdict.md", "docs/emulated-fleet.md")
"""The documents whose tables are generated (a guide holds the ones BENCHMARKS.md points to)."""
BLOCK = re.compile(r"(<!-- table: (\w+) (\S+) -->\n)(.*?)(<!-- /table -->)", re.S)


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


def matrix_table(data: dict) -> str:
    """``kvmesh bench policy_matrix``'s cells, a row per workload and rate, a column per KV movement: where the
    default falls short beyond the slack, or ok (the verdict recomputed from the figures; - : not run)."""
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


_SHORT = {"hit_rate": "hit", "ttft_p50": "p50", "ttft_p99": "p99"}


def _gap(metric: str, theirs: float, ours: float) -> str:
    """How far the default is from the better policy: points of hit rate, percent of TTFT."""
    if metric == "hit_rate":
        return f"{100 * (ours - theirs):+.1f} pt"
    return f"{100 * (ours / theirs - 1):+.0f}%"


def route_scaling_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.route_scaling import table

    return table(result)


def router_peers_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.router_peers import table

    return table(result)


def live_routers_table(result: dict) -> str:
    from kvmesh.cluster.measure.loadgen.live_compare import table

    return table(result)


_BENCH = "kvmesh.cluster.measure.benchmarks"
_SUPPORT = f"{_BENCH}.support"


def _module_table(module: str) -> Callable[[list[dict]], str]:
    """The table ``module``'s ``table(results)`` renders, the module imported when first used."""
    return lambda results: importlib.import_module(module).table(results)


def fp8_kv_cache_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.fp8_kv_cache import table

    return table(result)


def spec_decode_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.spec_decode import table

    return table(result)


def fp8_aot_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.fp8_kv_cache import aot_table

    return aot_table(result)


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


def replications_table(docs: list[dict]) -> str:
    from kvmesh.cluster.measure.benchmarks.headline import table

    return table(docs)


def routers_published_table(docs: list[dict]) -> str:
    from kvmesh.cluster.measure.benchmarks.support.routers_published_table import table

    return table(docs)


def queue_flood_table(docs: list[dict]) -> str:
    from kvmesh.cluster.measure.benchmarks.queue_flood import table_of

    return table_of(docs)


RENDERERS: dict[str, Callable[[dict], str]] = {"sim": sim_table, "matrix": matrix_table,
                                               "route_scaling": route_scaling_table, "lora": lora_table,
                                               "router_peers": router_peers_table, "fp8_kv_cache": fp8_kv_cache_table,
                                               "fp8_aot": fp8_aot_table, "spec_decode": spec_decode_table,
                                               "live_routers": live_routers_table}
MANY_RENDERERS: dict[str, Callable[[list[dict]], str]] = {
    "queue_flood": queue_flood_table, "matrix_noise": matrix_noise_table, "replications": replications_table,
    "routers_published": routers_published_table, "verdict": verdict_table,
    "live_verdict": _module_table(f"{_SUPPORT}.live_verdict_table"),
    "live_verdict_itl": _module_table(f"{_SUPPORT}.live_verdict_itl"),
    "live_verdict_shortfall": _module_table(f"{_SUPPORT}.live_verdict_shortfall"),
    "emulated_fleet": _module_table(f"{_BENCH}.emulated_fleet")}
"""Kinds whose table has a row per results file (FILE may be a pattern)."""


def variant_gain_table(docs: list[dict], root: Path) -> str:
    from kvmesh.cluster.measure.benchmarks.support.variant_gain import table

    return table(docs, root)


ROOTED_RENDERERS: dict[str, Callable[[list[dict], Path], str]] = {"variant_gain": variant_gain_table}
"""Kinds whose results files name other results files, read from the checkout (FILE may be a pattern)."""


def multi_router_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.multi_router import table

    return table(result)


RENDERERS["multi_router"] = multi_router_table  # kvmesh bench multi-router: routers on several Ray nodes, one killed


def fleet_quota_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.fleet_quota import table

    return table(result)


RENDERERS["fleet_quota"] = fleet_quota_table  # kvmesh bench fleet_quota: a tenant's limit through 1, 2, 4 routers


def first_constrained_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.first_constrained import table

    return table(result)


RENDERERS["first_constrained"] = first_constrained_table  # a replica's first constrained request, build against build


def soak_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.soak import table

    return table(result)


RENDERERS["soak"] = soak_table  # kvmesh bench soak: each process's memory over half an hour of mixed traffic


def sync_lag_table(result: dict) -> str:
    from kvmesh.cluster.measure.benchmarks.sync_lag import table

    return table(result)


RENDERERS["sync_lag"] = sync_lag_table  # kvmesh bench sync_lag: from one router's choice to another applying it


def render(text: str, root: Path) -> tuple[str, list[str]]:
    """``text`` with every table block regenerated from its file under ``root``, and the blocks that changed."""
    changed: list[str] = []

    def one(m: re.Match) -> str:
        head, kind, rel, body, tail = m.groups()
        if kind in MANY_RENDERERS or kind in ROOTED_RENDERERS:
            paths = sorted(root.glob(rel))
            if not paths:
                raise FileNotFoundError(f"{rel}: no results file of a generated table matches (run its command)")
            docs = [json.loads(p.read_text()) for p in paths]
            rendered = MANY_RENDERERS[kind](docs) if kind in MANY_RENDERERS else ROOTED_RENDERERS[kind](docs, root)
            table = rendered + "\n"
        elif kind in RENDERERS:
            path = root / rel
            if not path.exists():
                raise FileNotFoundError(f"{rel}: the results file of a generated table is missing (run its command)")
            table = RENDERERS[kind](json.loads(path.read_text())) + "\n"
        else:
            known = ", ".join([*RENDERERS, *MANY_RENDERERS, *ROOTED_RENDERERS])
            raise ValueError(f"table kind {kind!r} unknown; known: {known}")
        if table != body:
            changed.append(f"{kind} {rel}")
        return head + table + tail

    return BLOCK.sub(one, text), changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table differs from its file")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    args = ap.parse_args(argv)
    stale = []
    for name in DOCS:
        path = args.root / name
        text, changed = render(path.read_text(), args.root)
        stale += [f"{name}: {c}" for c in changed]
        if changed and not args.check:
            path.write_text(text)
    for line in stale:
        print(("differs: " if args.check else "rewrote: ") + line)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
