"""A soak: mixed traffic for half an hour through a router and two replicas, each process's memory sampled throughout.

    kvmesh bench soak                                        # results/soak.json and soak.png, 30 minutes
    kvmesh bench soak --duration 20 --warmup 5 --out /tmp/soak.json

A ``kvmesh router`` in front of two ``kvmesh replica`` processes of stories260K on loopback, events and replay wired,
two LoRA adapters, tool calls with ``tool_choice: auto`` served, a Responses store of the run's own
(support/soak_fleet.py). ``--concurrency`` clients send, for ``--duration`` seconds, a seeded mix
(support/soak_kinds.py, support/soak_hostile.py): chat on the base model and on an adapter, completions on an
adapter, ``json_schema``, regex and ``choice`` outputs, tool calls (``auto`` and a forced function), Responses
conversations (stored turns after ``previous_response_id``, retrieved, deleted), streams read to the end and streams
the client closes after a few chunks, and hostile bodies. A well-formed request must complete; a hostile one must get
a clean 4xx. Every ``--sample-s`` the resident memory of each process with its descendants is read from /proc.

The verdict (support/soak_verdict.py): each process's memory grows at most ``--max-growth`` from the warm-up mark
(``--warmup`` seconds in) to the end, no well-formed request fails, no hostile one gets anything but a clean 4xx.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.soak_fleet import SoakFleet
from kvmesh.cluster.measure.benchmarks.support.soak_traffic import TrafficSettings, drive
from kvmesh.cluster.measure.benchmarks.support.soak_verdict import SoakTally, trend_mb_per_10min, verdict
from kvmesh.cluster.measure.benchmarks.support.work_dir import in_work_dir, write_results
from kvmesh.cluster.measure.shared_dir import stories_model


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvmesh bench soak", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic")
    ap.add_argument("--warmup", type=float, default=300.0, help="seconds before the memory the growth is from")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of samples a memory reading is the median of")
    ap.add_argument("--max-growth", type=float, default=0.10, help="the verdict's bound on growth, a fraction")
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--concurrency", type=int, default=3, help="clients, one request in flight each")
    ap.add_argument("--think-s", type=float, default=0.2, help="seconds a client waits after each answer")
    ap.add_argument("--seed", type=int, default=0, help="the mix's seed")
    ap.add_argument("--model", type=Path, default=None, help="default: $KVMESH_SHARED_DIR/models/stories260K/hf")
    ap.add_argument("--work", default=None, help="keep the processes' logs in this folder (default: a temporary one)")
    ap.add_argument("--out", default="results/soak.json", help="results file (the plot beside it, .png)")
    return ap


def table(result: dict) -> str:
    """Each process's memory and the requests by kind as Markdown (``kvmesh bench report``'s ``soak`` kind)."""
    v, setup = result["verdict"], result["setup"]
    lines = [f"| process | RSS at {setup['warmup_s'] / 60:g} min | at the end ({setup['duration_s'] / 60:g} min) | "
             f"growth (bound {100 * v['max_growth']:g}%) | peak after warm-up | trend after warm-up |",
             "|---|---|---|---|---|---|"]
    for name, row in v["processes"].items():
        trend = trend_mb_per_10min(result["samples"], name, setup["warmup_s"])
        lines.append(f"| {name} | {row['at_warmup_mb']:.0f} MB | {row['at_end_mb']:.0f} MB | "
                     f"{100 * row['growth']:+.1f}% | {row['peak_after_warmup_mb']:.0f} MB | "
                     f"{trend:+.1f} MB per 10 min |")
    by_kind = result["tally"]["by_kind"]
    lines += ["", "| requests | sent | as they must be | failed |", "|---|---|---|---|"]
    for kind, row in sorted(by_kind.items()):
        lines.append(f"| {kind}{' (a clean 4xx each)' if kind == 'hostile' else ''} | {row['sent']:,} | "
                     f"{row['ok']:,} | {row['failed']:,} |")
    lines.append(f"\nVerdict: {'PASS' if v['ok'] else 'FAIL'}.")
    return "\n".join(lines)


async def _sample(fleet: SoakFleet, samples: list[dict], tally: SoakTally, args, t0: float, deadline: float) -> None:
    """A memory sample every ``--sample-s`` until the deadline; a progress line about every 30 s."""
    last_line = -30.0
    while True:
        t = time.monotonic() - t0
        samples.append({"t": round(t, 1), "rss_mb": {k: round(v, 1) for k, v in fleet.rss_mb().items()}})
        if t - last_line >= 30 or time.monotonic() >= deadline:
            last_line = t
            rss = ", ".join(f"{k} {v:.0f}" for k, v in samples[-1]["rss_mb"].items())
            print(f"[{t:6.0f}s] {tally.total():,} requests, {tally.failed(False)} well-formed failed, "
                  f"{tally.failed(True)} hostile misanswered; RSS MB: {rss}"
                  + "".join(f"; {e}" for e in fleet.exited()), flush=True)
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(min(args.sample_s, max(0.0, deadline - time.monotonic())))


async def _soak(fleet: SoakFleet, args, samples: list[dict], tally: SoakTally) -> None:
    settings = TrafficSettings(concurrency=args.concurrency, think_s=args.think_s, seed=args.seed)
    t0 = time.monotonic()
    deadline = t0 + args.duration
    await asyncio.gather(drive(fleet.url, fleet.key, settings, deadline, tally, t0),
                         _sample(fleet, samples, tally, args, t0, deadline))


def run(args: argparse.Namespace, work: Path) -> dict:
    fleet = SoakFleet(work)
    samples: list[dict] = []
    tally = SoakTally()
    t = time.monotonic()
    try:
        fleet.start(args.model or stories_model())
        print(f"[{time.monotonic() - t:5.1f}s to start] router and 2 replicas serving at {fleet.url}; "
              f"{args.duration:g} s of traffic", flush=True)
        asyncio.run(_soak(fleet, args, samples, tally))
        exited = fleet.exited()
        names = [p.name for p in fleet.processes]
    finally:
        fleet.stop()
    counts = tally.as_dict()
    hostile = counts["by_kind"].get("hostile", {"sent": 0})["sent"]
    return {"setup": {"duration_s": args.duration, "warmup_s": args.warmup, "window_s": args.window,
                      "sample_s": args.sample_s, "concurrency": args.concurrency, "think_s": args.think_s,
                      "seed": args.seed, "model": "stories260K"},
            "verdict": verdict(samples, names, tally, warmup_s=args.warmup, window_s=args.window,
                               max_growth=args.max_growth, exited=exited),
            "requests": {"well_formed_sent": tally.total() - hostile,
                         "well_formed_failed": counts["well_formed_failed"], "hostile_sent": hostile,
                         "hostile_misanswered": counts["hostile_misanswered"]},
            "tally": counts, "samples": samples}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.warmup < args.duration:
        raise SystemExit(f"--warmup ({args.warmup:g}) must be between 0 and --duration ({args.duration:g})")
    result = in_work_dir(args.work, "kvmesh-soak-", lambda work: run(args, work))
    out = write_results(result, args.out, "kvmesh bench soak " + " ".join(argv if argv is not None else sys.argv[1:]))
    from kvmesh.cluster.measure.benchmarks.support.soak_plot import plot

    plot(result, str(out.with_suffix(".png")))
    v = result["verdict"]
    for name, row in v["processes"].items():
        print(f"{name}: {row['at_warmup_mb']:.0f} MB at the warm-up mark, {row['at_end_mb']:.0f} MB at the end "
              f"({100 * row['growth']:+.1f}%)")
    print(f"{'PASS' if v['ok'] else 'FAIL'}: growth at most {100 * args.max_growth:g}% each, "
          f"{result['requests']['well_formed_failed']} well-formed failed, "
          f"{result['requests']['hostile_misanswered']} hostile misanswered; written to {out} and "
          f"{out.with_suffix('.png')}")
    return 0 if v["ok"] else 1
