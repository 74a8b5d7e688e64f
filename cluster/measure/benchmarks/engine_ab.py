"""Engine step overhead of two git revisions, interleaved in one run (a noisy machine affects both alike).

    python -m kvmesh.cluster.measure.benchmarks.engine_ab BEFORE_REV AFTER_REV [--repeats 3] [--out FILE]

Each revision is exported with ``git archive`` into a temporary directory and imported as ``kvmesh``
(PYTHONPATH ahead of the editable install); its own ``bench_step_overhead`` runs in a fresh process,
alternating A B B A A B ... Results (CPU ms per step by part, per run, and medians) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ("cluster", "events", "kvcache", "replica", "router")
RUN = ("import json, sys; from kvmesh.cluster.measure.benchmarks.engine import bench_step_overhead, parse_args; "
       "print(json.dumps(bench_step_overhead(parse_args(['--overhead-seqs', sys.argv[1]]))))")


def export(repo: Path, rev: str, root: Path) -> Path:
    """``rev`` of ``repo`` as an importable ``kvmesh`` package under ``root``; returns the PYTHONPATH entry."""
    tree = root / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    pkg = root / "path" / "kvmesh"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name in PACKAGES:
        (pkg / name).symlink_to(tree / name)
    return root / "path"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m kvmesh.cluster.measure.benchmarks.engine_ab",
                                description=__doc__.split("\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--out", default="results/engine_step_overhead_ab.json")
    args = p.parse_args(argv)
    repo = Path(__file__).resolve().parents[3]
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {k: export(repo, getattr(args, k), Path(tmp) / k) for k in runs}
        for i in range(args.repeats):
            for which in ("before", "after") if i % 2 == 0 else ("after", "before"):
                env = dict(os.environ, PYTHONPATH=str(paths[which]), OMP_NUM_THREADS="1")
                proc = subprocess.run([sys.executable, "-c", RUN, str(args.seqs)], env=env, check=True,
                                      capture_output=True, text=True)
                ms = json.loads(proc.stdout.strip().splitlines()[-1])["cpu_ms_per_step"]
                runs[which].append(ms)
                print(f"run {i} {which}: overhead {ms['overhead']:.2f} ms/step (calibration "
                      f"{ms['python_calibration']:.1f} ms)", flush=True)
    medians = {k: {part: statistics.median(r[part] for r in v) for part in v[0]} for k, v in runs.items()}
    result = {"before": args.before, "after": args.after, "running_seqs": args.seqs, "runs": runs,
              "median_cpu_ms_per_step": medians, "target": "overhead <= 2 ms", "load_avg_end": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: {p: round(v, 3) for p, v in m.items()} for k, m in medians.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
