"""README's headline comparison over replications: ``kvmesh sim`` on the whole Mooncake trace, 16 replicas, twice its
rate, the default against the peers' formulas and the baselines, once per arrival seed (``--arrival-seed K``).

    kvmesh bench headline --seeds 10                  # results/headline/sim_mooncake_2x_seed{K}.json, K = 0..9
    kvmesh bench report                               # README's table: mean and 95% interval over the files
    kvmesh bench headline --refresh llmd              # a policy whose formula changed, again on each seed

A seed whose file exists is kept (the runs resume); each run is one ``kvmesh sim`` process (``nice``), bounded by
``--timeout-s``. ``table`` (``kvmesh bench report``'s ``replications`` kind) turns the reports of one comparison
into a row per policy: the mean over the seeds and its 95% interval (Student's t), the default first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from kvmesh.cluster.measure.loadgen.intervals import interval

POLICIES = ("cache_aware_tokens", "dynamo", "llmd", "llmd_precise", "sglang", "cache_aware", "prefix_hash",
            "least_loaded", "round_robin", "random")
"""The default, the peers' formulas, then kvmesh's other policies and the load-blind baselines."""
SIM_ARGS = ("--num-replicas", "16", "--time-scale", "0.5")
"""README's headline cell."""


def _check(docs: list[dict]) -> None:
    """Every report one replication of the same comparison: an arrival seed each, the same policies."""
    seeds = [d["trace"].get("arrivals", "").split(":")[0] for d in docs]
    if not all(seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"replications need one report per distinct --arrival-seed; got {seeds}")
    names = [list(d["policies"]) for d in docs]
    if any(n != names[0] for n in names):
        raise ValueError("replications need the same policies in every report")


METRICS = (("of the single-pool ceiling", lambda p: 100 * p["hit_rate_vs_single_pool"], "{:.1f}%"),
           ("mean TTFT", lambda p: p["ttft_s"]["mean"], "{:.3f} s"),
           ("TTFT p50", lambda p: p["ttft_s"]["p50"], "{:.3f} s"),
           ("TTFT p99", lambda p: p["ttft_s"]["p99"], "{:.2f} s"))
"""The columns: name, the figure of one run, its format."""


def table(docs: list[dict]) -> str:
    """The replications as a table, a row per policy: mean ± half-width of the 95% interval of each metric."""
    from kvmesh.router.routing.policies import DEFAULT_POLICY

    _check(docs)
    rows = []
    for name in docs[0]["policies"]:
        cells = [interval([get(d["policies"][name]) for d in docs]) for _, get, _ in METRICS]
        rows.append((name, cells))
    rows.sort(key=lambda r: (r[0] != DEFAULT_POLICY, -r[1][0][0]))
    out = [f"| policy ({len(docs)} arrival seeds) | {' | '.join(m for m, _, _ in METRICS)} |",
           "|---" * (len(METRICS) + 1) + "|"]
    for name, cells in rows:
        label = f"**{name}** (the default)" if name == DEFAULT_POLICY else name
        figures = [f"{fmt.format(mean)} ± {fmt.format(half).replace(' s', '').replace('%', '')}"
                   for (mean, half), (_, _, fmt) in zip(cells, METRICS, strict=True)]
        out.append(f"| {label} | {' | '.join(figures)} |")
    return "\n".join(out)


def command(seed: int, out: Path) -> list[str]:
    """The ``kvmesh sim`` run of one arrival seed."""
    return [sys.executable, "-m", "kvmesh.cluster.cli", "sim", *SIM_ARGS, "--arrival-seed", str(seed),
            "--policies", ",".join(POLICIES), "--no-plot", "--no-progress", "--out", str(out)]


def refresh(out_dir: Path, seeds: int, policies: list[str], timeout_s: float) -> int:
    """``policies`` run again on each seed's stored report, their entries replaced in place (the others' runs are
    deterministic given the seed and stay); a report records what was refreshed (``refreshed``), so a bounded run
    resumes."""
    if unknown := set(policies) - set(POLICIES):
        raise SystemExit(f"--refresh names policies of the comparison ({', '.join(POLICIES)}), not "
                         f"{', '.join(sorted(unknown))}")
    for seed in range(seeds):
        out = out_dir / f"sim_mooncake_2x_seed{seed}.json"
        report = json.loads(out.read_text())
        if report.get("refreshed") == policies:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "sim.json"
            cmd = command(seed, fresh)
            cmd[cmd.index("--policies") + 1] = ",".join(policies)
            print(" ".join(["kvmesh", *cmd[cmd.index("sim"):]]), flush=True)
            subprocess.run(["nice", "-n", "5", *cmd], check=True, stdout=subprocess.DEVNULL, timeout=timeout_s)
            again = json.loads(fresh.read_text())["policies"]
        report["policies"] = {name: again.get(name, figures) for name, figures in report["policies"].items()}
        report["refreshed"] = policies
        out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvmesh bench headline", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="arrival seeds 0..N-1 (default: %(default)s)")
    ap.add_argument("--out-dir", default="results/headline", help="one report per seed here (default: %(default)s)")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="most seconds one seed's run may take")
    ap.add_argument("--refresh", default=None, metavar="RIVALS",
                    help="run these policies (comma-separated) again on every seed's report and put their figures "
                         "in place: after their formulas changed")
    args = ap.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.refresh is not None:
        return refresh(out_dir, args.seeds, args.refresh.split(","), args.timeout_s)
    for seed in range(args.seeds):
        out = out_dir / f"sim_mooncake_2x_seed{seed}.json"
        if out.exists():
            continue
        cmd = ["nice", "-n", "5", *command(seed, out)]
        print(" ".join(["kvmesh", *cmd[cmd.index("sim"):]]), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=args.timeout_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
