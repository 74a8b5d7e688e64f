"""The router's predicted time to first token against the one clients see, on a live 2-replica cluster.

    python -m kvmesh.cluster.measure.benchmarks.ttft_prediction [--model ../shared/models/stories260K/hf]
        [--requests 300] [--warmup 40] [--concurrency 4] [--out results/ttft_prediction.json]

Two real replicas (``kvmesh replica``, stories260K on CPU) and ``kvmesh router`` (cache_aware) in front, each its own
process on ephemeral ports. Clients stream completions of mixed prompts (a few shared story prefixes of 40-400
tokens plus a unique tail, so hits, misses and queues all occur) with ``x-kvmesh-receipt``, and compare the
router's ``x-kvmesh-predicted-ttft-s`` with the TTFT they measure (request sent to the first streamed token).
The first ``--warmup`` requests let the replicas measure their rates and the router learn its correction; the
error distribution is over the rest: |actual - predicted| / actual, its median (acceptance: <= 20%), p90, and
the ratio actual / predicted per replica. Every wait is bounded; the processes are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.startup import _free_port
from kvmesh.cluster.measure.shared_dir import stories_model

CLI = [sys.executable, "-m", "kvmesh.cluster.cli"]
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her big red ball. "
         "One day, she saw a dog in the park and the dog wanted to play with the ball too. Lily was happy to share, "
         "and they played together until the sun went down. ")
NAMES = ["Tom", "Ben", "Sue", "Max", "Amy", "Sam", "Mia", "Leo"]


def prompts(n: int, seed: int) -> list[str]:
    """``n`` prompts: one of 6 shared prefixes (1/4 to 4 stories long) + a unique tail."""
    rng = random.Random(seed)
    prefixes = [f"{NAMES[i]} said: " + STORY * k for i, k in enumerate((1, 1, 2, 2, 3, 4))]
    return [rng.choice(prefixes) + f" Then {rng.choice(NAMES)} counted to {rng.randrange(10_000)}." for _ in range(n)]


def start(args: argparse.Namespace) -> tuple[list[subprocess.Popen], str]:
    procs, specs = [], []
    for i in range(2):
        http, events, replay = _free_port(), _free_port(), _free_port()
        procs.append(subprocess.Popen([*CLI, "replica", "--model", args.model, "--port", str(http), "--event-port",
                                       str(events), "--replay-port", str(replay), "--kv-cache-memory", "8MiB",
                                       "--max-num-seqs", "16"], stdout=subprocess.DEVNULL, stderr=_log(f"r{i}")))
        specs += ["--replica", f"http://127.0.0.1:{http},events=tcp://127.0.0.1:{events},"
                               f"replay=tcp://127.0.0.1:{replay},name=r{i}"]
    port = _free_port()
    procs.append(subprocess.Popen([*CLI, "router", "--port", str(port), "--model", args.model, "--log-level", "error",
                                   *specs], stdout=subprocess.DEVNULL, stderr=_log("router")))
    return procs, f"http://127.0.0.1:{port}"


def _log(name: str):
    return tempfile.NamedTemporaryFile(prefix=f"kvmesh-ttft-prediction-{name}-", suffix=".log", delete=False)


async def wait_ready(session, url: str, procs: list[subprocess.Popen], timeout_s: float = 180.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process exited; logs in {tempfile.gettempdir()}/kvmesh-ttft-prediction-*.log")
        try:
            one = await stream_once(session, url, "Once upon a time", 2)
            if one["ttft_s"] is not None:
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the router did not answer within {timeout_s:.0f}s")


async def stream_once(session, url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: the client's TTFT, the router's prediction, the replica."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body, headers={"x-kvmesh-receipt": "1"}) as r:
        out = {"status": r.status, "replica": r.headers.get("x-kvmesh-replica"), "ttft_s": None,
               "predicted_s": float(r.headers["x-kvmesh-predicted-ttft-s"])
               if "x-kvmesh-predicted-ttft-s" in r.headers else None,
               "hit_tokens": int(r.headers.get("x-kvmesh-predicted-hit-tokens", 0)),
               "prompt_tokens": int(r.headers.get("x-kvmesh-prompt-tokens", 0))}
        async for raw in r.content:
            line = raw.decode(errors="replace").strip()
            if out["ttft_s"] is None and line.startswith("data: {") and '"text"' in line:
                out["ttft_s"] = time.perf_counter() - t0
    return out


async def drive(url: str, args: argparse.Namespace, procs: list[subprocess.Popen]) -> list[dict]:
    import aiohttp

    todo = prompts(args.requests + args.warmup, args.seed)
    rng = random.Random(args.seed + 1)
    results: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await wait_ready(session, url, procs)

        async def client(k: int) -> None:
            while todo:
                i = len(results) + 0
                prompt = todo.pop()
                one = await stream_once(session, url, prompt, rng.choice((8, 16, 32)))
                one["index"] = i
                results.append(one)
                await asyncio.sleep(rng.expovariate(1 / args.think_s))

        await asyncio.gather(*(client(k) for k in range(args.concurrency)))
    return results


def summarize(results: list[dict], warmup: int) -> dict:
    measured = [r for r in results[warmup:] if r["ttft_s"] and r["predicted_s"]]
    errors = sorted(abs(r["ttft_s"] - r["predicted_s"]) / r["ttft_s"] for r in measured)

    def q(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

    per_replica = {}
    for rid in sorted({r["replica"] for r in measured}):
        ratios = sorted(r["ttft_s"] / r["predicted_s"] for r in measured if r["replica"] == rid)
        per_replica[rid] = {"requests": len(ratios), "ratio_p10": q(ratios, 0.1), "ratio_p50": q(ratios, 0.5),
                            "ratio_p90": q(ratios, 0.9)}
    return {"requests": len(measured), "unpriced": sum(1 for r in results[warmup:] if not r["predicted_s"]),
            "non_200": sum(1 for r in results if r["status"] != 200),
            "abs_error_p10": q(errors, 0.1), "abs_error_p50": q(errors, 0.5), "abs_error_p90": q(errors, 0.9),
            "within_20pct": sum(e <= 0.2 for e in errors) / len(errors) if errors else float("nan"),
            "ttft_p50_s": statistics.median(r["ttft_s"] for r in measured) if measured else None,
            "predicted_p50_s": statistics.median(r["predicted_s"] for r in measured) if measured else None,
            "per_replica": per_replica}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(stories_model()))
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--think-s", type=float, default=0.05, help="mean pause of a client between its requests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/ttft_prediction.json")
    args = ap.parse_args(argv)
    procs, url = start(args)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        results = asyncio.run(drive(url, args, procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
    summary = summarize(results, args.warmup)
    summary |= {"wall_s": time.perf_counter() - wall0, "client_cpu_s": time.process_time() - cpu0,
                "args": vars(args)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "requests": results}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if summary["abs_error_p50"] <= 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
