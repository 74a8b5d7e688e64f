"""Replica HTTP overhead and streaming throughput (``kvmesh bench replica_http``).

1. p50/p99 latency of a 1-token completion: through HTTP (a ``kvmesh replica`` subprocess, so
   client and server do not share a GIL) vs. calling the engine directly (``AsyncLLM.generate``
   in this process). The difference is what the HTTP layer costs per request.
2. Streaming throughput: ``--concurrency`` clients each stream ``--stream-tokens`` tokens at once
   (SSE); output tokens/s, requests/s and the TTFT spread -- and the same streams through
   ``AsyncLLM`` directly, for the engine's own ceiling.

Writes ``results/replica_http.json`` (``--out``) and a PNG of the latency distributions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.peer_load import stop_processes
from kvmesh.cluster.measure.shared_dir import stories_model


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def _summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {"n": len(ms), "p50_ms": _pct(ms, 50), "p90_ms": _pct(ms, 90), "p99_ms": _pct(ms, 99),
            "mean_ms": statistics.fmean(ms)}


def start_replica(args: argparse.Namespace) -> tuple[subprocess.Popen, dict]:
    cmd = [sys.executable, "-m", "kvmesh.cluster.cli", "replica", "--model", args.model, "--port", "0",
           "--event-port", "none", "--kv-cache-memory", str(args.kv_cache_memory), "--max-num-seqs", "256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"replica did not start: {' '.join(cmd)}")
    return proc, json.loads(line)


async def http_latency(url: str, prompt: list[int], n: int, warmup: int) -> list[float]:
    import aiohttp

    req = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    out = []
    async with aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=60),
                                     raise_for_status=True) as c:
        for i in range(n + warmup):
            t0 = time.perf_counter()
            async with c.post("/v1/completions", json=req) as r:
                await r.read()
            if i >= warmup:
                out.append(time.perf_counter() - t0)
    return out


async def engine_direct(args: argparse.Namespace, prompt: list[int]) -> tuple[list[float], dict]:
    """1-token latencies and 64-stream throughput through ``AsyncLLM`` in this process (no HTTP)."""
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.async_llm import AsyncLLM
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model)
    config = EngineConfig(model=args.model, kv_cache_memory=args.kv_cache_memory, max_num_seqs=256)
    llm = AsyncLLM.from_config(config, tok.hf)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    out = []
    try:
        for i in range(args.requests + args.warmup):
            t0 = time.perf_counter()
            async for _ in llm.generate(prompt, params, request_id=f"b{i}"):
                pass
            if i >= args.warmup:
                out.append(time.perf_counter() - t0)

        async def one(i: int) -> int:
            sp = SamplingParams(max_tokens=args.stream_tokens, ignore_eos=True, seed=i)
            last = None
            async for o in llm.generate(tok.render_completion(f"Story {i}: once upon a time"), sp,
                                               request_id=f"s{i}"):
                last = o
            return len(last.output_token_ids)

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(args.concurrency)))
        wall = time.perf_counter() - t0
    finally:
        llm.shutdown()
    return out, {"concurrency": args.concurrency, "wall_s": wall, "output_tokens": sum(counts),
                 "output_tokens_per_s": sum(counts) / wall}


async def stream_throughput(url: str, concurrency: int, tokens: int) -> dict:
    import aiohttp

    ttfts: list[float] = []
    counts: list[int] = []
    async with aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=concurrency)) as c:

        async def one(i: int) -> None:
            req = {"prompt": f"Story {i}: once upon a time", "max_tokens": tokens, "ignore_eos": True,
                   "stream": True, "stream_options": {"include_usage": True}, "seed": i}
            t0 = time.perf_counter()
            first = None
            usage = None
            async with c.post("/v1/completions", json=req) as r:
                async for raw_line in r.content:  # one SSE line at a time
                    line = raw_line.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if first is None and chunk["choices"]:
                        first = time.perf_counter() - t0
                    usage = chunk.get("usage") or usage
            ttfts.append(first or 0.0)
            counts.append(usage["completion_tokens"])

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "tokens_per_request": tokens, "wall_s": wall,
            "output_tokens": sum(counts), "output_tokens_per_s": sum(counts) / wall,
            "requests_per_s": concurrency / wall, "ttft": _summary(ttfts)}


def plot(result: dict, http_s: list[float], engine_s: list[float], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([v * 1000 for v in engine_s], bins=40, alpha=0.6, label="engine (AsyncLLM)")
    ax.hist([v * 1000 for v in http_s], bins=40, alpha=0.6, label="HTTP /v1/completions")
    ax.set_xlabel("1-token completion latency (ms)")
    ax.set_ylabel("requests")
    s = result["streaming"]
    ax.set_title(f"{s['concurrency']} streams: {s['output_tokens_per_s']:.0f} tok/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    default_model = str(stories_model())
    p = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench replica_http",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.environ.get("KVMESH_BENCH_MODEL", default_model))
    p.add_argument("--requests", type=int, default=200, help="sequential 1-token requests per path")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--kv-cache-memory", type=int, default=64 << 20)
    p.add_argument("--out", default="results/replica_http.json")
    args = p.parse_args(argv)
    prompt = [1, 403, 407, 261, 378]  # "Once upon a time" in stories260K
    print(f"engine-direct latency ({args.requests} requests) ...", flush=True)
    engine_s, engine_streaming = asyncio.run(engine_direct(args, prompt))
    print("starting replica subprocess ...", flush=True)
    proc, info = start_replica(args)
    try:
        print(f"HTTP latency against {info['http_url']} ...", flush=True)
        http_s = asyncio.run(http_latency(info["http_url"], prompt, args.requests, args.warmup))
        print(f"streaming with {args.concurrency} clients ...", flush=True)
        streaming = asyncio.run(stream_throughput(info["http_url"], args.concurrency, args.stream_tokens))
    finally:
        stop_processes([proc], 30)
    result = {
        "model": args.model, "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
        "one_token_latency": {"http": _summary(http_s), "engine_direct": _summary(engine_s)},
        "http_overhead_p50_ms": _summary(http_s)["p50_ms"] - _summary(engine_s)["p50_ms"],
        "streaming": streaming,
        "streaming_engine_direct": engine_streaming,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, http_s, engine_s, out.with_suffix(".png"))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
