"""The policy matrix over arrival seeds (``kvmesh bench policy_matrix --seeds N``): per cell, one whole-trace
``kvmesh sim --arrival-seed K`` run per seed over the default, the peers' formulas and the baselines; the verdict of
``paired_verdict`` per cell, with more seeds (up to ``--max-seeds``) while a cell is undecided. A variant of the default
(``variant_matrix``: a knob set) is judged on a verdict file's stored seeds against the same stored rivals.

Each seed's per-policy figures are written to the results file as it finishes (the runs resume); the verdict is
recomputed from them by ``kvmesh bench report`` (its ``verdict`` kind, ``table``). When a policy's formula changes
(a rival's or the default's), ``refresh_matrix`` runs it again on the seeds stored (``--refresh``) and keeps the
others' runs.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.paired_verdict import (
    FAIL,
    METRICS,
    PASS,
    UNDECIDED,
    judge_cell,
)

PEERS = ("dynamo", "llmd", "llmd_precise", "sglang")
"""The peers' formulas: the default should beat each beyond the margin on a primary metric at 2x and 3x."""


def figures(report: dict) -> dict[str, dict[str, float]]:
    """A ``kvmesh sim`` report's per-policy figures the verdict reads (with a host tier: the runs with the tier)."""
    out = {}
    for name, p in report["policies"].items():
        if name.endswith("/no-tier"):
            continue
        if "hit_rate_vs_single_pool" not in p or "ttft_slo" not in p:
            raise ValueError(f"{name}: the report lacks the single-pool ceiling or the workload's TTFT SLO")
        out[name.removesuffix("/host-tier")] = {
            "hit_share": p["hit_rate_vs_single_pool"], "ttft_mean": p["ttft_s"]["mean"],
            "good_share": p["ttft_slo"]["good_share"], "ttft_p50": p["ttft_s"]["p50"], "ttft_p99": p["ttft_s"]["p99"]}
    return out


def sim_command(workload: str, time_scale: float, kv_flags: list[str], seed: int, policies: list[str],
                replicas: int) -> list[str]:
    """The ``kvmesh sim`` arguments of one seed of one cell (the whole trace, ceilings on)."""
    return ["sim", "--workload", workload, "--num-replicas", str(replicas), "--time-scale", f"{time_scale:.6g}",
            "--arrival-seed", str(seed), "--policies", ",".join(policies), "--no-plot", "--no-progress", *kv_flags]


def run_sim(args: list[str], niceness: int, timeout_s: float | None = None) -> tuple[dict, float]:
    """One ``kvmesh sim`` process of ``args`` (from ``sim`` on; at ``niceness``, killed past ``timeout_s``): its
    report and wall seconds. The matrix's screen, its seeds and their refreshes all run through it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        cmd = ["nice", "-n", str(niceness), sys.executable, "-m", "kvmesh.cluster.cli", *args, "--out", str(out)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=os.environ.copy(), timeout=timeout_s)
        return json.loads(out.read_text()), time.perf_counter() - t0


def run_seed(args: list[str], niceness: int, timeout_s: float) -> tuple[dict, float]:
    """One seed's ``kvmesh sim`` process: the figures the verdict reads and its wall seconds."""
    report, wall = run_sim(args, niceness, timeout_s)
    return figures(report), wall


def cell_state(cell: dict, default: str) -> str | None:
    """The cell's verdict from its seeds so far (None: none run)."""
    seeds = [cell["seeds"][k] for k in sorted(cell["seeds"], key=int)]
    return judge_cell(seeds, default)["verdict"] if len(seeds) >= 2 else None


def seeds_to_run(cell: dict, default: str, min_seeds: int, max_seeds: int) -> int | None:
    """The next seed a cell needs: below ``min_seeds``, or while undecided below ``max_seeds`` (None: done)."""
    have = len(cell["seeds"])
    if have < min_seeds:
        return next(k for k in range(max_seeds) if str(k) not in cell["seeds"])
    if have >= max_seeds or cell_state(cell, default) != UNDECIDED:
        return None
    return next(k for k in range(max_seeds) if str(k) not in cell["seeds"])


def merged(docs: list[dict]) -> dict:
    """The cells of several results files of one default (the matrix split over processes by ``--out``); each cell is
    judged against the rivals its file compares, so a file may compare fewer while a rival's new formula is run on
    it (``refresh_matrix``)."""
    first, cells = docs[0], {}
    for d in docs:
        if d["default"] != first["default"]:
            raise ValueError(f"verdict files of different defaults: {first['default']} and {d['default']}")
        if twice := set(cells) & set(d["cells"]):
            raise ValueError(f"cells in two verdict files: {', '.join(sorted(twice))}")
        cells |= d["cells"]
    return first | {"cells": cells}


def table(data: dict, matrix_size: int) -> str:
    """A row per cell run: its seeds, its verdict (below ``min_seeds``: the verdict its seeds so far give, not
    counted), the pairs that fail or straddle with their intervals, and the peers' formulas it beats on a primary
    metric; then the count (of the ``matrix_size`` cells of the whole matrix). A cell without some of the peers the
    other cells compare (a rival being run again on new formulas) says which, and is counted apart. A variant's file
    (``variant_matrix``) says its knob in place of the matrix's count."""
    default, by_name = data["default"], {m.name: m for m in METRICS}
    out = ["| cell | seeds | verdict | rivals better beyond the margin, or straddling it (default - rival, 95% "
           "interval) "
           "| peers beaten |", "|---|---|---|---|---|"]
    judged = {key: judge_cell([cell["seeds"][k] for k in sorted(cell["seeds"], key=int)], default)
              for key, cell in data["cells"].items() if len(cell["seeds"]) >= 2}
    compared = [p for p in PEERS if any(p in j["pairs"] for j in judged.values())]
    counts = {PASS: 0, FAIL: 0, UNDECIDED: 0}
    partial, lacking = dict(counts), set()
    running = sum(len(cell["seeds"]) for key, cell in data["cells"].items() if key not in judged)
    for key, j in judged.items():
        cell, verdict = data["cells"][key], j["verdict"]
        missing = [p for p in compared if p not in j["pairs"]]
        if j["seeds"] < data.get("min_seeds", 2):  # not yet a verdict: the intervals so far
            running += 1
            verdict = f"{verdict} so far ({j['seeds']} of {data['min_seeds']} seeds)"
        else:
            (partial if missing else counts)[verdict] += 1
            lacking.update(missing)
        if missing:
            verdict += f" (without {', '.join(missing)})"
        notes = [f"{'**' if v == FAIL else ''}{rival} {by_name[m].label} {j['diffs'][rival][m].describe(by_name[m])}"
                 f"{'**' if v == FAIL else ' (undecided)'}"
                 for rival, per in j["pairs"].items() for m, v in per.items() if v != PASS]
        peers = [p for p in PEERS if p in j["pairs"]]
        beaten = f"{sum(p in j['beaten'] for p in peers)}/{len(peers)}" if peers else "-"
        minutes = sum(cell["wall_s"].values()) / 60
        out.append(f"| {key} | {j['seeds']} ({minutes:.0f} min) | {verdict} | {'; '.join(notes) or '-'} "
                   f"| {beaten} |")
    run, apart = sum(counts.values()), sum(partial.values())
    left = (f"{matrix_size - run - apart} of the matrix's {matrix_size} cells have no verdict yet ({running} of "
            "them running)." if run + apart < matrix_size else "every cell of the matrix has run its seeds.")
    if "variant_of" in data:  # variant_matrix: a knob's cells, not the matrix
        left = f"the default with {variant_words(data)}, on the seeds of {data['variant_of']}."
    cells_run = f"{run} cell" + "s" * (run != 1)
    line = f"{counts[PASS]} pass, {counts[FAIL]} fail, {counts[UNDECIDED]} undecided (of {cells_run} with their seeds"
    if apart:
        names = ", ".join(p for p in compared if p in lacking)
        line += (f" and every peer's formula); without {names}, whose formulas are not yet run again on them: "
                 f"{partial[PASS]} pass, {partial[FAIL]} fail, {partial[UNDECIDED]} undecided (of {apart}")
    return "\n".join(out) + f"\n\n{line}); {left}"


def run_matrix(out: Path, cells: list[tuple[str, float, list[str]]], *, default: str, policies: list[str],
               min_seeds: int, max_seeds: int, replicas: int, niceness: int, timeout_s: float,
               budget_s: float | None) -> None:
    """Run ``cells`` ((key, time scale, kv flags) each, in order) to ``min_seeds`` each, then the undecided ones on
    to ``max_seeds`` (every cell gets its verdict before any gets extra seeds), writing ``out`` after every seed;
    stop starting seeds after ``budget_s``."""
    data = json.loads(out.read_text()) if out.exists() else {}
    if data and (data["default"], data["policies"]) != (default, policies):
        raise SystemExit(f"{out} holds another comparison (default {data['default']}, policies {data['policies']}): "
                         "name another --out")
    if any("refreshing" in cell for cell in data.get("cells", {}).values()):
        raise SystemExit(f"{out} is mid-refresh: finish it (--refresh) before adding seeds")
    data = data or {"default": default, "policies": policies, "replicas": replicas, "cells": {}}
    data |= {"min_seeds": min_seeds, "max_seeds": max_seeds}
    t0 = time.perf_counter()
    for cap, (key, scale, kv_flags) in itertools.product((min_seeds, max_seeds), cells):
        cell = data["cells"].setdefault(key, {"seeds": {}, "wall_s": {}})
        while (seed := seeds_to_run(cell, default, min_seeds, cap)) is not None:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                print(f"budget spent: {key} seed {seed} and what follows not run", flush=True)
                return
            args = sim_command(key.split("/")[0], scale, kv_flags, seed, policies, replicas)
            cell["command"] = "kvmesh " + " ".join(args).replace(f"--arrival-seed {seed}", "--arrival-seed K")
            cell["seeds"][str(seed)], wall = run_seed(args, niceness, timeout_s)
            cell["wall_s"][str(seed)] = round(wall, 1)
            print(f"{key} seed {seed}: {wall:.0f} s; verdict so far: {cell_state(cell, default)}", flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(data, indent=1) + "\n")


def refresh_command(cell: dict, seed: str, policies: list[str]) -> list[str]:
    """A cell's recorded ``kvmesh sim`` command for one seed, running ``policies`` only."""
    args = shlex.split(with_policies(cell["command"], policies))[1:]
    args[args.index("--arrival-seed") + 1] = seed
    return args


def refresh_matrix(out: Path, policies: list[str], *, niceness: int, timeout_s: float,
                   budget_s: float | None) -> None:
    """Run ``policies`` (the default or rivals) again on every seed ``out`` holds and put their figures in place of
    the stored ones, or beside them for a rival the file does not compare yet: for formulas that changed, when the
    others' runs (deterministic given the seed) stay valid. Each cell marks the seeds done (``refreshing``) until
    every cell is, so a bounded run resumes; ``run_matrix`` refuses a file mid-refresh. A seed's minutes (``wall_s``)
    add the run."""
    data = json.loads(out.read_text())
    if not policies or not all(policies):
        raise SystemExit("--refresh names the policies to run again, comma-separated")
    t0 = time.perf_counter()
    for key, cell in data["cells"].items():
        marker = cell.setdefault("refreshing", {"policies": policies, "seeds": []})
        if marker["policies"] != policies:
            raise SystemExit(f"{out}: {key} is mid-refresh of {marker['policies']}: finish that first")
        for seed in sorted(cell["seeds"], key=int):
            if seed in marker["seeds"]:
                continue
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                print(f"budget spent: {key} seed {seed} and what follows not refreshed", flush=True)
                return
            figures, wall = run_seed(refresh_command(cell, seed, policies), niceness, timeout_s)
            cell["seeds"][seed] |= figures
            cell["wall_s"][seed] = round(cell["wall_s"].get(seed, 0.0) + wall, 1)
            marker["seeds"].append(seed)
            print(f"{key} seed {seed}: {', '.join(policies)} again in {wall:.0f} s", flush=True)
            out.write_text(json.dumps(data, indent=1) + "\n")
    data["policies"] += [p for p in policies if p not in data["policies"]]
    for cell in data["cells"].values():
        del cell["refreshing"]
        cell["command"] = with_policies(cell["command"], data["policies"])
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{out}: {', '.join(policies)} refreshed on every seed", flush=True)


def variant_matrix(source: Path, out: Path, keys: list[str], knobs: list[str], *, seeds: int | None, niceness: int,
                   timeout_s: float, budget_s: float | None, router_knobs: Sequence[str] = ()) -> None:
    """The default with ``knobs`` (``K=V`` each, ``kvmesh sim --policy-kwargs``) and ``router_knobs`` (``K=V`` each, a
    router field: kvmesh sim's flag of that name, ``predict_hold_s=30`` -> ``--predict-hold-s 30``) run on the stored
    seeds of
    ``source``'s cells ``keys`` (the first ``seeds`` of each; None: all) and written to ``out`` beside the rivals'
    stored runs of those seeds, so ``kvmesh bench report`` judges the variant as the verdict judges the default. The
    minutes of a seed are the variant's run. Resumes; a finished ``out`` is left as it is."""
    if not out.exists():
        if not knobs and not router_knobs:
            raise SystemExit("--variant-of runs the default with a knob: give --policy-kwargs or --router-kwargs K=V")
        if seeds is not None and seeds < 2:
            raise SystemExit(f"--seeds with --variant-of takes the first N stored seeds, at least 2; got {seeds}")
        src = json.loads(source.read_text())
        if busy := [k for k in keys if not refreshed(src["cells"].get(k, {}))]:
            raise SystemExit(f"{source} is mid-refresh in {', '.join(busy)}: finish it (--refresh) first")
        if missing := [k for k in keys if k not in src["cells"]]:
            raise SystemExit(f"{source} has no cell {', '.join(missing)} (it has {', '.join(src['cells'])})")
        flags = "".join(f" --policy-kwargs {shlex.quote(kv)}" for kv in knobs) + "".join(
            f" {router_flag(kv)}" for kv in router_knobs)
        cells = {}
        for key in keys:
            kept = sorted(src["cells"][key]["seeds"], key=int)[:seeds]
            cells[key] = {"seeds": {k: src["cells"][key]["seeds"][k] for k in kept}, "wall_s": {},
                          "command": src["cells"][key]["command"] + flags,
                          "refreshing": {"policies": [src["default"]], "seeds": []}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"default": src["default"], "policies": src["policies"], "variant_of": str(source),
                                   "policy_kwargs": knobs, "router_kwargs": list(router_knobs), "cells": cells},
                                  indent=1) + "\n")
    data = json.loads(out.read_text())
    if not any("refreshing" in c for c in data["cells"].values()):
        print(f"{out}: every seed has run with {variant_words(data)}", flush=True)
        return
    refresh_matrix(out, [data["default"]], niceness=niceness, timeout_s=timeout_s, budget_s=budget_s)


def refreshed(cell: dict) -> bool:
    """Whether every seed of ``cell`` has run the policies a refresh runs again (or none is being run again): its
    rivals' figures are then all of one formula, though other cells of its file may still be mid-refresh."""
    marker = cell.get("refreshing")
    return marker is None or set(marker["seeds"]) == set(cell["seeds"])


def router_flag(knob: str) -> str:
    """``K=V`` of a router field -> kvmesh sim's flag for it (``predict_hold_s=30`` -> ``--predict-hold-s 30``)."""
    name, sep, value = knob.partition("=")
    if not sep or not name.isidentifier() or not value:
        raise SystemExit(f"--router-kwargs takes NAME=VALUE (a router field), got {knob!r}")
    return f"--{name.replace('_', '-')} {shlex.quote(value)}"


def variant_words(data: dict) -> str:
    """A variant file's knobs as the table says them: the policy's ``K=V``, then the router's ``router.K=V``."""
    return " ".join([*data["policy_kwargs"], *(f"router.{kv}" for kv in data.get("router_kwargs", []))])


def with_policies(command: str, policies: list[str]) -> str:
    """A cell's recorded command with ``--policies`` naming ``policies``."""
    args = shlex.split(command)
    args[args.index("--policies") + 1] = ",".join(policies)
    return shlex.join(args)
