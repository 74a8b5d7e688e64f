"""Every routing policy over the matrix of workloads, rates and KV movement: is the default policy's hit rate at least
every other policy's and its TTFT p50 and p99 at most theirs?

    kvmesh bench policy_matrix --out results/policy_matrix.json          # every cell not in the file yet
    kvmesh bench policy_matrix --workloads mooncake --rates 2x --kv none  # a slice
    kvmesh bench policy_matrix --jitter 1e-4 --out results/policy_matrix_jitter_up.json   # every arrival 0.01% later
    kvmesh bench policy_matrix --seeds 10 --max-seeds 20     # the verdict over arrival seeds:
    results/policy_verdict.json
    kvmesh bench policy_matrix --refresh llmd --out results/policy_verdict.json   # a changed formula again
    kvmesh bench policy_matrix --refresh cache_aware_tokens --out results/policy_matrix_jitter_up.json   # a screen
    kvmesh bench policy_matrix --variant-of results/policy_verdict.json --workloads chatbot --rates 2x --kv none \
        --policy-kwargs churn_clamp=4 --out results/policy_variants/churn_clamp4.json   # a knob on stored seeds
    kvmesh bench policy_matrix --variant-of results/policy_verdict.json --workloads mooncake --rates 2x --kv none \
        --router-kwargs predict_hold_s=30 --out results/policy_variants/hold30.json     # a router field likewise

With ``--seeds N`` each cell runs the whole trace (no miniature) once per arrival seed, N seeds and more while its
verdict is undecided (support/matrix_seeds.py, support/paired_verdict.py: paired differences default - rival with
95% intervals against margins); the single-run cells below are the matrix without replications.

A cell is one ``kvmesh sim`` process (``nice -n 10`` unless ``--nice``, 16 replicas, ``--miniature 8``, no ceilings)
over every
registered policy: a workload (the shared traces whole, and generated ones), a rate (``--time-scale`` 1, 1/2, 1/3),
and how KV moves (none; peer pulls at 1.8e9 or 25e9 B/s; a host tier holding a quarter of the working set).
``--jitter`` moves every cell's time scale by that fraction: the same workloads, arrivals shifted by 0.01% for 1e-4,
which no one would call another workload; the verdicts of such runs, side by side, show which cells the simulator's
own sensitivity decides (``kvmesh bench report``'s ``matrix_noise`` table). Cells are written to the results file as
they finish, so a bounded run can be resumed; ``dominance`` is the one
verdict the benchmark, its table (``kvmesh bench report``) and the guard test (tests/sim/test_default_dominates.py)
apply.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import run_sim
from kvmesh.router.routing.policies import DEFAULT_POLICY

WORKLOADS = ("mooncake", "azure_conv", "azure_code", "multi_turn", "chatbot", "tool_agent")
"""The shared traces (Mooncake's hash_ids; the Azure traces with generated prefixes) and generated workloads."""
RATES = {"1x": 1.0, "2x": 0.5, "3x": 1 / 3}
"""Label -> ``--time-scale``."""
KV = {"none": [], "pull1.8G": ["--peer-pulls", "--kv-transfer-bytes-per-s", "1.8e9"],
      "pull25G": ["--peer-pulls", "--kv-transfer-bytes-per-s", "25e9"],
      "host": ["--offload-capacity-fraction", "0.25", "--no-offload-compare"]}
"""Label -> the ``kvmesh sim`` flags of how KV moves (a host tier: its runs only, the verdict reads no others)."""
HIT_SLACK = 0.002
"""Hit rate (a fraction) the default may fall short of another policy's and still count as at least as good."""
TTFT_SLACK = 0.01
"""Relative TTFT the default may exceed another policy's by and still count as at most as high."""


def dominance(policies: dict[str, dict], best: str = DEFAULT_POLICY) -> dict[str, tuple[str, float, float]]:
    """Where ``best`` falls short of another policy beyond the slack: {metric: (policy, its value, best's value)},
    the worst such policy per metric ({}: it dominates). ``policies``: name -> {"hit_rate", "ttft_p50", "ttft_p99"}."""
    mine, short = policies[best], {}
    for name, p in policies.items():
        if name == best:
            continue
        if mine["hit_rate"] < p["hit_rate"] - HIT_SLACK and p["hit_rate"] > short.get("hit_rate", ("", 0.0))[1]:
            short["hit_rate"] = (name, p["hit_rate"], mine["hit_rate"])
        for metric in ("ttft_p50", "ttft_p99"):
            if mine[metric] > p[metric] * (1 + TTFT_SLACK) and p[metric] < short.get(metric, ("", float("inf")))[1]:
                short[metric] = (name, p[metric], mine[metric])
    return short


def verdicts(data: dict) -> dict[str, dict[str, tuple[str, float, float]]]:
    """A results file's cells -> where its default falls short in each ({}: it meets the verdict there), recomputed
    from the figures with today's slack."""
    return {key: dominance(cell["policies"], data["default"]) for key, cell in data["cells"].items()}


def count_line(data: dict) -> str:
    """How many cells the default meets, by workload and by rate, and whom its shortfalls are to."""
    short = verdicts(data)
    met = [key for key, s in short.items() if not s]

    def tally(part: int) -> str:
        groups = list(dict.fromkeys(key.split("/")[part] for key in short))
        groups = sorted(groups) if part == 1 else groups  # rates: 1x, 2x, 3x

        def count(keys, group: str) -> int:
            return sum(k.split("/")[part] == group for k in keys)

        return ", ".join(f"{g} {count(met, g)}/{count(short, g)}" for g in groups)

    misses = [name for s in short.values() for name, _, _ in s.values()]
    rivals = ", ".join(f"{n} to `{name}`" for name, n in sorted(
        {name: misses.count(name) for name in misses}.items(), key=lambda kv: -kv[1]))
    return (f"The default meets the verdict in {len(met)} of {len(short)} cells ({tally(0)}; {tally(1)}). "
            f"Its {len(misses)} shortfalls (a metric in a cell): {rivals or 'none'}.")


def noise_table(docs: list[dict]) -> str:
    """Runs of the same matrix with every time scale moved a little (``--jitter``): the cells each meets, which cells'
    verdicts hold in every run, and how far each policy's TTFT moved between runs (the simulator's own sensitivity)."""
    docs = sorted(docs, key=lambda d: d.get("jitter", 0.0))
    short = [verdicts(d) for d in docs]
    keys = [k for k in short[0] if all(k in s for s in short)]
    lines = ["| time scales | cells met |", "|---|---|"]
    for d, s in zip(docs, short, strict=True):
        jitter = d.get("jitter", 0.0)
        label = "as listed" if not jitter else f"x {1 + jitter:.4f} (`--jitter={jitter:g}`)"
        lines.append(f"| {label} | {sum(not s[k] for k in keys)} of {len(keys)} |")
    every = sum(all(not s[k] for s in short) for k in keys)
    none = sum(all(s[k] for s in short) for k in keys)
    lines.append(f"| met in every run / in none / in some only | {every} / {none} / {len(keys) - every - none} |")
    lines += ["", "| policy | TTFT p50 moved, median / max over cells | TTFT p99 moved, median / max |",
              "|---|---|---|"]
    for name in docs[0]["cells"][keys[0]]["policies"]:
        moved = {m: sorted(_moved([d["cells"][k]["policies"][name][m] for d in docs]) for k in keys)
                 for m in ("ttft_p50", "ttft_p99")}
        lines.append(f"| {name} | " + " | ".join(f"{100 * statistics.median(v):.1f}% / {100 * v[-1]:.0f}%"
                                                for v in moved.values()) + " |")
    return "\n".join(lines)


def _moved(values: list[float]) -> float:
    """The spread of one figure over the runs, relative to its smallest."""
    return (max(values) - min(values)) / min(values) if min(values) > 0 else 0.0


def summary(report: dict) -> dict[str, dict]:
    """A ``kvmesh sim`` report's per-policy figures the verdict reads (with a host tier: the runs with the tier)."""
    return {name.removesuffix("/host-tier"): {"hit_rate": p["hit_rate"], "ttft_p50": p["ttft_s"]["p50"],
                                               "ttft_p99": p["ttft_s"]["p99"], "load_imbalance": p["load_imbalance"]}
            for name, p in report["policies"].items() if not name.endswith("/no-tier")}


def run_cell(workload: str, time_scale: float, kv_flags: list[str], replicas: int, miniature: int,
             niceness: int = 10) -> dict:
    """One ``kvmesh sim`` run over every policy (at ``niceness``); its per-policy figures and its wall seconds."""
    args = ["sim", "--workload", workload, "--num-replicas", str(replicas), "--time-scale", str(time_scale),
            "--miniature", str(miniature), "--no-ceilings", "--no-plot", "--no-progress", *kv_flags]
    report, wall = run_sim(args, niceness)
    return {"policies": summary(report), "wall_s": round(wall, 1), "requests": report["trace"]["requests"],
            "command": " ".join(["kvmesh", *args])}


def refresh_screen(out: Path, policies: list[str], niceness: int, budget_s: float | None = None) -> None:
    """Run ``policies`` again in every cell of the screen ``out`` (its recorded command, those policies only) and put
    their figures in place of the stored ones, the cell's shortfalls recomputed: after their formulas changed, the
    other policies' runs staying valid (a policy's run does not depend on the others run beside it). Each cell
    records the policies it has run again (``refreshed``) until every cell has, so a bounded run resumes."""
    data = json.loads(out.read_text())
    t0 = time.perf_counter()
    for key, cell in data["cells"].items():
        done = cell.setdefault("refreshed", [])
        if done and done != policies:
            raise SystemExit(f"{out}: {key} is mid-refresh of {done}: finish that first")
        if done == policies:
            continue
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            print(f"budget spent: {key} and the cells after it not refreshed", flush=True)
            return
        report, wall = run_sim([*shlex.split(cell["command"])[1:], "--policies", ",".join(policies)], niceness)
        cell["policies"] |= summary(report)
        cell["wall_s"] = round(cell["wall_s"] + wall, 1)
        cell["short"] = dominance(cell["policies"])
        cell["refreshed"] = policies
        print(f"{key}: {', '.join(policies)} again; {DEFAULT_POLICY} short of {cell['short'] or 'none'}", flush=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
    for cell in data["cells"].values():
        del cell["refreshed"]
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{out}: {', '.join(policies)} refreshed in every cell", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results JSON (resumed when it exists; default: the screen's, "
                    "results/policy_matrix.json, or with --seeds or --refresh the verdict's, "
                    "results/policy_verdict.json)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rates", default=",".join(RATES))
    ap.add_argument("--kv", default=",".join(KV), help=f"comma-separated of {', '.join(KV)}")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--miniature", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=None, help="start no cell after this many seconds")
    ap.add_argument("--nice", type=int, default=10, help="niceness of each cell's process")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="relative change of every cell's time scale (1e-4: every arrival time 0.01%% later)")
    ap.add_argument("--seeds", type=int, default=None,
                    help="arrival seeds per cell: the verdict over replications (results/policy_verdict.json)")
    ap.add_argument("--max-seeds", type=int, default=20, help="with --seeds: most seeds an undecided cell gets")
    ap.add_argument("--policies", default=None, help="with --seeds: the policies compared (default: the headline's)")
    ap.add_argument("--timeout-s", type=float, default=7200.0, help="with --seeds: most seconds of one seed's run")
    ap.add_argument("--refresh", default=None, metavar="POLICIES",
                    help="run these policies (comma-separated; rivals or the default) again on every seed --out "
                         "holds, keeping the others' runs: after their formulas changed")
    ap.add_argument("--policy-kwargs", action="append", default=[], metavar="K=V",
                    help="with --seeds: a knob of the policies compared, each taking the ones it has (kvmesh sim's "
                         "--policy-kwargs; e.g. the default's ghost_weight=1); name another --out")
    ap.add_argument("--router-kwargs", action="append", default=[], metavar="K=V",
                    help="with --variant-of: a router field the variant changes, as kvmesh sim's flag of that name "
                         "(predict_hold_s=30: --predict-hold-s 30)")
    ap.add_argument("--variant-of", default=None, metavar="FILE",
                    help="run the default with --policy-kwargs and --router-kwargs on the seeds FILE (a --seeds "
                         "results file) stores for "
                         "the cells --workloads, --rates and --kv name (with --seeds N: the first N), beside FILE's "
                         "rivals, into --out")
    args = ap.parse_args(argv)
    if args.variant_of is not None:
        from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import variant_matrix

        if args.out is None:
            raise SystemExit("--variant-of writes a file of its own: name it with --out")
        keys = [f"{w}/{rate}/{kv}" for rate in args.rates.split(",") for kv in args.kv.split(",")
                for w in args.workloads.split(",")]
        return variant_matrix(Path(args.variant_of), Path(args.out), keys, args.policy_kwargs, seeds=args.seeds,
                              niceness=args.nice, timeout_s=args.timeout_s, budget_s=args.budget_s,
                              router_knobs=args.router_kwargs)
    if args.refresh is not None:
        from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import refresh_matrix

        out = Path(args.out or "results/policy_verdict.json")
        if "miniature" in json.loads(out.read_text()):  # a screen (single runs), not a verdict over seeds
            return refresh_screen(out, args.refresh.split(","), args.nice, args.budget_s)
        return refresh_matrix(out, args.refresh.split(","), niceness=args.nice, timeout_s=args.timeout_s,
                              budget_s=args.budget_s)
    if args.seeds is not None:
        return _run_seeds(args)
    out = Path(args.out or "results/policy_matrix.json")
    data = json.loads(out.read_text()) if out.exists() else {}
    if data and data.get("jitter", 0.0) != args.jitter:
        raise SystemExit(f"{out} holds cells run with --jitter {data.get('jitter', 0.0)}, not {args.jitter}: "
                         "name another --out")
    cells = data.get("cells", {})
    t0 = time.perf_counter()
    for rate in args.rates.split(","):
        for kv in args.kv.split(","):
            for w in args.workloads.split(","):
                key = f"{w}/{rate}/{kv}"
                if key in cells:
                    continue
                if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
                    print(f"budget spent: {key} and the cells after it not run", flush=True)
                    return
                cell = run_cell(w, RATES[rate] * (1 + args.jitter), KV[kv], args.replicas, args.miniature, args.nice)
                cell["short"] = dominance(cell["policies"])
                cells[key] = cell
                print(f"{key}: {DEFAULT_POLICY} short of {cell['short'] or 'none'} ({cell['wall_s']:.0f} s)",
                      flush=True)
                out.write_text(json.dumps({"default": DEFAULT_POLICY, "replicas": args.replicas,
                                           "miniature": args.miniature, "jitter": args.jitter, "cells": cells},
                                          indent=1) + "\n")


def _run_seeds(args: argparse.Namespace) -> None:
    from kvmesh.cluster.measure.benchmarks.headline import POLICIES
    from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import run_matrix

    if args.seeds < 2 or args.max_seeds < args.seeds:
        raise SystemExit(f"--seeds needs at least 2 and --max-seeds at least --seeds; got {args.seeds}, "
                         f"{args.max_seeds}")
    out = Path(args.out or "results/policy_verdict.json")
    knobs = [flag for kv in args.policy_kwargs for flag in ("--policy-kwargs", kv)]
    cells = [(f"{w}/{rate}/{kv}", RATES[rate], KV[kv] + knobs) for rate in args.rates.split(",")
             for kv in args.kv.split(",") for w in args.workloads.split(",")]
    policies = args.policies.split(",") if args.policies else list(POLICIES)
    if policies[0] != DEFAULT_POLICY:
        raise SystemExit(f"--policies must name the default ({DEFAULT_POLICY}) first; got {policies[0]}")
    run_matrix(out, cells, default=DEFAULT_POLICY, policies=policies, min_seeds=args.seeds,
               max_seeds=args.max_seeds, replicas=args.replicas, niceness=args.nice, timeout_s=args.timeout_s,
               budget_s=args.budget_s)


if __name__ == "__main__":
    main()
