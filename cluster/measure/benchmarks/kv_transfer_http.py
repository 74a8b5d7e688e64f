"""Per-request overhead of a KV pull over HTTP between two replica processes (nixl over UCX).

    kvmesh bench kv-transfer --http [--model DIR] [--requests 20] [--prompt-tokens 428]
                                    [--out results/kv_transfer_http.json]

A ``kvmesh replica --kv-transfer`` subprocess (the holder) and a replica in this process (the puller), both
with KV transfer on (nixl). Per request: a fresh prompt is computed on the holder, then sent to the puller
with ``kv_transfer_params: {"do_remote_prefill": true, "remote_url": holder}`` and ``max_tokens=1``. The
pull's own seconds (lease + handshake, cached after the first + READ + release, as the puller's
``kvmesh_kv_transfer_pull_seconds`` records it) and the whole request's wall time are recorded, next to
the same request computed on the puller without a pull. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support import json_http as http

SEED = "kv-transfer-http-bench-seed"


def _holder(model: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "KVMESH_HASH_SEED": SEED}
    env.pop("KVMESH_API_KEY", None)
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "kvmesh"), "replica", "--model", model, "--port", "0", "--event-port",
         "none", "--kv-cache-memory", "64MiB", "--kv-transfer"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, text=True)
    line = next((line for line in process.stdout if line.startswith("{")), None)  # nixl logs to stdout too
    if line is None:
        raise RuntimeError(f"the holder replica exited with {process.wait()}")
    return process, json.loads(line)["http_url"]


def _pull_seconds_sum(url: str) -> float:
    found = re.search(r"^kvmesh_kv_transfer_pull_seconds_sum ([0-9.e+-]+)$", http.get(url + "/metrics").text, re.M)
    return float(found.group(1))


def run(model: str, requests: int, prompt_tokens: int) -> dict:
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.kv_transfer.config import KVTransferConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    process, holder_url = _holder(model)
    puller = ReplicaRuntime.start(EngineConfig(model=model, hash_seed=SEED, kv_cache_memory=64 << 20),
                                  ReplicaServerConfig(port=0, event_port=None),
                                  kv_transfer=KVTransferConfig(enabled=True, peers=(holder_url,)))
    rng, rows = random.Random(0), []
    try:
        for i in range(requests + 1):  # the first one shakes hands: reported apart
            prompt, computed = ([rng.randrange(3, 500) for _ in range(prompt_tokens)] for _ in range(2))
            body = {"max_tokens": 1, "temperature": 0}
            http.post(holder_url + "/v1/completions", {"prompt": prompt, **body}).raise_for_status()
            before = _pull_seconds_sum(puller.http.url)
            w0 = time.perf_counter()
            r = http.post(puller.http.url + "/v1/completions", {"prompt": prompt, **body, "kv_transfer_params": {
                "do_remote_prefill": True, "remote_url": holder_url}})
            pulled_s = time.perf_counter() - w0
            r.raise_for_status()
            pull_s = _pull_seconds_sum(puller.http.url) - before
            w0 = time.perf_counter()
            http.post(puller.http.url + "/v1/completions", {"prompt": computed, **body}).raise_for_status()
            rows.append({"request": i, "outcome": r.headers["x-kvmesh-kv-pull"],
                         "pulled_tokens": int(r.headers["x-kvmesh-kv-pulled-tokens"]),
                         "pulled_bytes": int(r.headers["x-kvmesh-kv-pulled-bytes"]), "pull_s": pull_s,
                         "request_with_pull_s": pulled_s, "request_computed_s": time.perf_counter() - w0})
            print(f"{i:>3} {rows[-1]['outcome']:>7} {rows[-1]['pulled_tokens']} tokens: pull "
                  f"{pull_s * 1e3:.2f} ms, request {pulled_s * 1e3:.2f} ms (computed: "
                  f"{rows[-1]['request_computed_s'] * 1e3:.2f} ms)", flush=True)
    finally:
        puller.shutdown(graceful_s=1)
        process.terminate()
        process.wait(timeout=60)
    steady = rows[1:]
    return {"model": model, "prompt_tokens": prompt_tokens, "requests": rows,
            "first_pull_s": rows[0]["pull_s"], "pull_median_s": statistics.median(r["pull_s"] for r in steady),
            "request_with_pull_median_s": statistics.median(r["request_with_pull_s"] for r in steady),
            "request_computed_median_s": statistics.median(r["request_computed_s"] for r in steady),
            "pulled_bytes": steady[0]["pulled_bytes"], "all_ok": all(r["outcome"] == "ok" for r in rows)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench kv-transfer --http",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="../shared/models/stories260K/hf", help="HF model directory")
    parser.add_argument("--requests", type=int, default=20, help="pulls measured (after a first, handshaking one)")
    parser.add_argument("--prompt-tokens", type=int, default=428, help="tokens per prompt")
    parser.add_argument("--out", type=Path, default=Path("results/kv_transfer_http.json"), help="JSON output path")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.prompt_tokens < 16:
        parser.error("--requests must be at least 1 and --prompt-tokens at least 16 (one full block)")
    if not Path(args.model).is_dir():
        parser.error(f"--model {args.model} is not a directory")
    from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

    if nixl_missing():
        print(f"kvmesh bench kv-transfer --http: {nixl_missing()}", file=sys.stderr)
        return 2
    results = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                           "cpus": os.cpu_count()},
               "transport": "nixl (UCX)", **run(args.model, args.requests, args.prompt_tokens)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}: pull {results['pull_median_s'] * 1e3:.2f} ms median "
          f"(first, with the handshake: {results['first_pull_s'] * 1e3:.2f} ms)", flush=True)
    return 0
