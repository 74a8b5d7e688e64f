"""Dynamo's arm of the live verdict: NVIDIA Dynamo's frontend with its KV router in front of its own mocker workers,
given the emulated fleet's step times, block size, KV blocks, step budget and time dilation, sent the same requests as
a ``kvmesh bench live_verdict`` results file's routers were; its rounds are added to that file as the router
``dynamo`` (support/dynamo_fleet.py says how the timing is handed over).

    kvmesh bench live_verdict_dynamo --verdict results/live_verdict_chatbot.json
    kvmesh bench live_verdict_dynamo --verdict /tmp/lv.json --rounds 1 --peers-dir ../peers

Dynamo's router talks only to Dynamo's workers, so its rounds run on other replicas than the verdict's routers, after
them, each on a fresh frontend and fresh workers (empty caches): the same requests and the same GPU timing, other
replicas. Its figures sit beside the others in the table; the paired differences against kvmesh are by round number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.dynamo_fleet import PEER, TTFT_METRIC
from kvmesh.cluster.measure.benchmarks.support.emulated_fleet_live import MAX_MODEL_LEN


def load_argv(settings: dict) -> list[str]:
    """``kvmesh bench load``'s flags that send what the verdict's routers were sent (its results' ``settings``)."""
    s = settings
    return ["--workload", s["workload"], "--num-prefixes", str(s["num_prefixes"]),
            "--num-requests", str(s["num_requests"]), "--max-prompt-tokens", str(s["max_prompt_tokens"]),
            "--max-tokens", str(s["max_tokens"]), "--mode", "open", "--rate", f"{s['rate']:g}",
            "--prompt-format", "text", "--tokens-per-word", f"{s['tokens_per_word']:g}", "--seed", str(s["seed"])]


async def run_rounds(args: argparse.Namespace, verdict: dict, work: Path) -> list[dict]:
    """Dynamo's rounds: a fresh frontend and fresh workers each, the verdict's requests through them."""
    from kvmesh.cluster.config.flags import config_from_args
    from kvmesh.cluster.measure.benchmarks.live_verdict import fleet_sizes
    from kvmesh.cluster.measure.benchmarks.support.dynamo_fleet import (
        dynamo_python,
        model_dir,
        running_dynamo,
        write_profile,
    )
    from kvmesh.cluster.measure.loadgen.live_compare import round_line
    from kvmesh.cluster.measure.loadgen.live_routers import peers_dir
    from kvmesh.cluster.measure.loadgen.load import build_parser, run_bench
    from kvmesh.cluster.measure.loadgen.options import BENCH_LOAD_SCHEMA
    from kvmesh.cluster.measure.shared_dir import stories_model

    python = dynamo_python(peers_dir(args.peers_dir))
    fleet = verdict["fleet"]
    sim = fleet_sizes(argparse.Namespace(replicas=fleet["replicas"], num_kv_blocks=fleet["num_kv_blocks"]), work)
    sizes = {"replicas": fleet["replicas"], "blocks_per_replica": fleet["num_kv_blocks"],
             "max_num_batched_tokens": sim["max_num_batched_tokens"], "max_num_seqs": sim["max_num_seqs"],
             "max_model_len": MAX_MODEL_LEN}
    profile = write_profile(sim["cost"], work / "profile.npz")
    model = model_dir(stories_model(), work)
    settings = verdict["settings"]
    config = config_from_args(build_parser().parse_args(["--url", "http://unused", *load_argv(settings)]),
                              BENCH_LOAD_SCHEMA)
    arm = arm_name(args.router_mode)
    rows = []
    for rnd in range(args.rounds):
        with running_dynamo(python, model, profile, sizes, fleet["dilation"], work, f"{arm}-round{rnd}",
                            args.router_mode) as dynamo:
            before = dynamo.cpu_s()
            out = await run_bench(replace(config, endpoint=replace(config.endpoint, url=dynamo.url)),
                                  f"{arm}/{settings['workload']} round {rnd}", progress=False)
            cpu = [b - a for a, b in zip(before, dynamo.cpu_s(), strict=True)]
            ttft = dynamo.router_ttft()
        rows.append(router_timed_row(rnd, arm, settings["workload"], out, ttft) |
                    {"cpu_s": {"workers": cpu[0], "frontend": cpu[1], "wall": out["summary"]["duration_s"]}})
        print(round_line(rows[-1]), flush=True)
        with (work / "rows.jsonl").open("a") as f:  # kept whatever happens to the rounds after it
            f.write(json.dumps(rows[-1]) + "\n")
    return rows


def router_timed_row(rnd: int, arm: str, workload: str, out: dict, ttft: dict[str, float]) -> dict:
    """A round's row with its TTFT from Dynamo's router (``DynamoFleet.router_ttft``): the mean is exact, the
    percentiles and goodput are not known (None; the histogram's buckets are a factor of two apart); the client's
    figures, whose first chunk is the last, stay under ``client_ttft_s`` (the end-to-end time)."""
    from kvmesh.cluster.measure.loadgen.live_compare import request_ttfts

    summary = dict(out["summary"])
    summary["client_ttft_s"] = summary["ttft_s"]
    summary["ttft_s"] = {"mean": ttft["sum"] / ttft["count"] if ttft["count"] else None, "p50": None, "p99": None,
                         "count": ttft["count"], "from": TTFT_METRIC}
    return {"round": rnd, "router": arm, "workload": workload, "summary": summary, "replicas": [],
            "ttft_s": None, "client_ttft_s": request_ttfts(out["requests"])}


def arm_name(router_mode: str) -> str:
    """The arm's name in the results: ``dynamo`` at its KV router, ``dynamo:MODE`` at another mode."""
    return PEER if router_mode == "kv" else f"{PEER}:{router_mode}"


def dynamo_version(peers: Path) -> str:
    """The installed ``ai-dynamo``'s version (its dist-info), or "unknown"."""
    found = sorted(peers.glob(f"{PEER}/lib/python*/site-packages/ai_dynamo-*.dist-info"))
    return found[-1].name.removeprefix("ai_dynamo-").removesuffix(".dist-info") if found else "unknown"


def add_rows(verdict: dict, rows: list[dict], command: str, version: str) -> dict:
    """``verdict`` with the arm's rows (one arm: ``rows[0]["router"]``) in place of any it had, its stats recomputed
    and the command recorded under ``dynamo`` (per arm)."""
    from kvmesh.cluster.measure.loadgen.live_compare import stats

    workload, arm = verdict["settings"]["workload"], rows[0]["router"]
    kept = [r for r in verdict["rows"] if r["router"] != arm]
    names = [n for n in verdict["stats"][workload] if n != arm] + [arm]
    verdict = verdict | {"rows": kept + rows}
    verdict["stats"] = stats(verdict["rows"], names, [workload])
    verdict["dynamo"] = verdict.get("dynamo", {}) | {arm: {"command": command, "version": version,
                                                           "rounds": len(rows)}}
    return verdict


def main(argv: list[str] | None = None) -> int:
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_table import table
    from kvmesh.cluster.measure.loadgen.live_compare import plot
    from kvmesh.cluster.measure.loadgen.live_routers import peers_dir

    ap = argparse.ArgumentParser(prog="kvmesh bench live_verdict_dynamo", description=__doc__.splitlines()[0])
    ap.add_argument("--verdict", required=True, help="a kvmesh bench live_verdict results file; Dynamo's rows go in")
    ap.add_argument("--rounds", type=int, default=None, help="default: the verdict's")
    ap.add_argument("--peers-dir", default=None, help="the peers' virtualenvs (default: ../peers); Dynamo's: dynamo/")
    ap.add_argument("--work", default=None, help="a folder for the profile, the model's copy and the logs")
    ap.add_argument("--no-plot", action="store_true", help="leave the verdict's plot as it is")
    ap.add_argument("--router-mode", default="kv",
                    help="Dynamo's --router-mode: kv (its KV router, the arm), or round-robin to check its workers "
                         "against the verdict's vllm-router:round_robin (same routing, other replicas)")
    args = ap.parse_args(argv)
    path = Path(args.verdict)
    verdict = json.loads(path.read_text())
    args.rounds = args.rounds or verdict["rounds"]
    work = Path(args.work or tempfile.mkdtemp(prefix="kvmesh-dynamo-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = asyncio.run(run_rounds(args, verdict, work))
    except (ValueError, RuntimeError) as e:
        print(f"kvmesh bench live_verdict_dynamo: {e}", file=sys.stderr)
        return 2
    command = "kvmesh bench live_verdict_dynamo " + " ".join(argv if argv is not None else sys.argv[3:])
    verdict = add_rows(verdict, rows, command, dynamo_version(peers_dir(args.peers_dir)))
    path.write_text(json.dumps(verdict, indent=1))
    written = [str(path)] + ([] if args.no_plot else [str(plot(verdict, path.with_suffix(".png")))])
    print(table([verdict]), flush=True)
    print(f"[live_verdict_dynamo] wrote {', '.join(written)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
