"""What the router's prefill/decode split costs per request, without a model: the prefill call, the handle and
the decode replica's lease release, through the real router in front of fake replicas (fake_replica.py).

    python -m kvmesh.cluster.measure.benchmarks.router_pd_split [--requests 300] [--out results/router_pd_split.json]

Two routers over the same fake prefill replica ``p`` and decode replica ``d`` (KV transfer on): one splits every
prompt (``pd_min_uncached_tokens`` 32), one never does. One client alternates between them, a fresh 428-token
prompt each time (stories260K tokenizer), so both see the same machine load; the numbers are the routers' whole
latency per request, split minus whole is the split's overhead (model time excluded: the fakes compute nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support import json_http as http

PROMPT_TOKENS = 428


def _launch(name: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.support.fake_replica", "--name",
                             name,
                             "--port", "0", "--event-port", "0", "--block-size", "16", "--num-blocks", "65536"],
                            stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def _wait_healthy(server, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(server.runtime.router.healthy) < n:
        if time.monotonic() > deadline:
            raise RuntimeError("replicas did not become healthy")
        time.sleep(0.05)


def measure(requests: int) -> dict:
    from kvmesh.cluster.measure.shared_dir import stories_model
    from kvmesh.replica.serving.tokenizer import load_tokenizer
    from kvmesh.router.config import ReplicaSpec, RouterConfig
    from kvmesh.router.control.router_server import RouterServer
    from kvmesh.router.routing.kv_placement import KVPlacementRules

    procs = [_launch("p"), _launch("d")]
    servers = []
    try:
        (_, p), (_, d) = procs
        for info in (p, d):
            http.post(info["url"] + "/fake/config", {"kv_transfer": {"enabled": True}}, timeout=5).raise_for_status()
        specs = [ReplicaSpec(p["url"], p["events"], replica_id="p", role="prefill"),
                 ReplicaSpec(d["url"], d["events"], replica_id="d", role="decode")]
        tokenizer = load_tokenizer(str(stories_model()))
        for pd_min in (10**9, 32):
            servers.append(RouterServer(RouterConfig(port=0, block_size=16,
                                                     transfers=KVPlacementRules(pd_min_uncached_tokens=pd_min)), specs,
                                        tokenizer=tokenizer).start())
            _wait_healthy(servers[-1], 2)
        rng, latency = random.Random(0), {"whole": [], "split": []}
        for i in range(requests + 20):
            for label, server in zip(("whole", "split"), servers, strict=True):
                ids = [rng.randrange(3, 500) for _ in range(PROMPT_TOKENS)]
                t0 = time.perf_counter()
                r = http.post(server.url + "/v1/completions", {"prompt": ids, "max_tokens": 2})
                if r.status != 200:
                    raise RuntimeError(f"{label}: HTTP {r.status}: {r.text[:200]}")
                if i >= 20:  # warm-up done
                    latency[label].append((time.perf_counter() - t0) * 1e3)
        splits = servers[1].runtime.metrics.registry.get_sample_value("kvmesh_router_pd_splits_total",
                                                                      {"outcome": "ok"})
        out = {label: {"p50_ms": statistics.median(v), "p90_ms": sorted(v)[int(0.9 * len(v))], "n": len(v)}
               for label, v in latency.items()}
        out["split_overhead_p50_ms"] = out["split"]["p50_ms"] - out["whole"]["p50_ms"]
        out["splits_ok"] = splits
        out["prompt_tokens"] = PROMPT_TOKENS
        return out
    finally:
        for server in servers:
            server.stop()
        for proc, _ in procs:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="measured requests per router (after 20 warm-up)")
    ap.add_argument("--out", default="results/router_pd_split.json", help="results JSON")
    args = ap.parse_args(argv)
    result = measure(args.requests)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
