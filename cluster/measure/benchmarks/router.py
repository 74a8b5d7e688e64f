"""Router benchmarks: index ingest, prefix match, the routing decision, and added HTTP latency.

    kvmesh bench router [--out results/router.json] [--quick]

1. ingest   BlockStored/BlockRemoved events applied per second (router keys re-hashed from token ids)
2. match    lookups/s of a 256-block prompt against 64 replicas holding prefixes of it
3. decide   hash + match + score of a 4,096-token prompt over 64 replicas, per-stage p50/p99
            (tokenization measured separately, with the stories260K tokenizer when present)
4. latency  a 1k-token prompt through the router vs straight to a replica (an instant echo
            replica in its own process; the router in another), low load, p50/p99
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.router_http import measure_added_latency
from kvmesh.cluster.measure.shared_dir import stories_model
from kvmesh.events.schema import BlockRemoved, BlockStored

BS = 16


def _chain_events(rng: random.Random, num_chains: int, blocks_per_chain: int, salt_every: int = 0):
    """BlockStored events of independent chains plus the BlockRemoved that evict them."""
    stored, removed = [], []
    for c in range(num_chains):
        tokens = [rng.randrange(32000) for _ in range(blocks_per_chain * BS)]
        hashes = [rng.getrandbits(64) for _ in range(blocks_per_chain)]
        extra = [["salt-key"]] + [None] * (blocks_per_chain - 1) if salt_every and c % salt_every == 0 else None
        stored.append(BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=BS,
                                  lora_id=None, medium="GPU", lora_name=None, extra_keys=extra))
        removed.append(BlockRemoved(block_hashes=hashes[::-1], medium="GPU"))
    return stored, removed


def bench_ingest(quick: bool) -> dict:
    from kvmesh.router.routing.index import PrefixIndex

    rng = random.Random(0)
    num_replicas, chains, blocks = 8, (200 if quick else 2000), 16
    per_replica = [_chain_events(rng, chains // num_replicas, blocks, salt_every=10) for _ in range(num_replicas)]
    index = PrefixIndex(BS)
    total = chains * blocks
    w0, c0 = time.perf_counter(), time.thread_time()
    for r, (stored, _) in enumerate(per_replica):
        index.apply(str(r), stored)
    w1, c1 = time.perf_counter(), time.thread_time()
    for r, (_, removed) in enumerate(per_replica):
        index.apply(str(r), removed)
    w2, c2 = time.perf_counter(), time.thread_time()
    assert index.num_blocks() == 0
    return {"blocks": total, "events": 2 * chains, "blocks_per_event": blocks, "replicas": num_replicas,
            "stored_blocks_per_s": total / (w1 - w0), "removed_blocks_per_s": total / (w2 - w1),
            "block_events_per_s": 2 * total / (w2 - w0),
            "cpu_stored_blocks_per_s": total / (c1 - c0), "cpu_removed_blocks_per_s": total / (c2 - c1),
            "cpu_block_events_per_s": 2 * total / (c2 - c0), "target_block_events_per_s": 2_000_000}


def _populated(num_replicas: int, prompt_blocks: int, rng: random.Random, typical: bool = False, index=None):
    """An index where each replica holds a prefix of the prompt, plus noise.

    Worst case (default): every replica at its own random depth (up to 64 distinct drop points).
    ``typical``: all share a 32-block system prompt, two replicas hold the whole prompt.
    """
    from kvmesh.router.routing.index import PrefixIndex

    index = index or PrefixIndex(BS, predict_ttl_s=0.0)
    hasher = index.hasher
    prompt = [rng.randrange(32000) for _ in range(prompt_blocks * BS)]
    for r in range(num_replicas):
        depth = (prompt_blocks if r < 2 else 32) if typical else rng.randrange(prompt_blocks + 1)
        if depth:
            index.apply(str(r), [BlockStored(block_hashes=[rng.getrandbits(64) for _ in range(depth)],
                                        parent_block_hash=None, token_ids=prompt[:depth * BS], block_size=BS,
                                        lora_id=None, medium="GPU", lora_name=None)])
        noise, _ = _chain_events(rng, 20, 16)
        index.apply(str(r), noise)
    return index, hasher, prompt


def bench_match(quick: bool) -> dict:
    out = {"replicas": 64, "prompt_blocks": 256, "target_lookups_per_s": 100_000}
    for case in ("worst_case", "typical"):
        rng = random.Random(1)
        index, hasher, prompt = _populated(64, 256, rng, typical=case == "typical")
        keys = hasher.keys(prompt)
        n = 2000 if quick else 20000
        match = index.match
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            match(keys)
        w1, c1 = time.perf_counter(), time.thread_time()
        out[case] = {"replicas_matched": len(match(keys)), "distinct_depths": len(set(match(keys).values())),
                     "lookups_per_s": n / (w1 - w0), "cpu_lookups_per_s": n / (c1 - c0)}
    return out


def calibration() -> dict:
    """How fast this machine runs the C-level dict lookups a match is made of (to compare machines)."""
    d = {random.getrandbits(64): 1 for _ in range(200_000)}
    keys = list(d)[:256]
    c0 = time.thread_time()
    for _ in range(2000):
        list(map(d.get, keys))
    per_get = (time.thread_time() - c0) / (2000 * 256)
    return {"ns_per_dict_get": per_get * 1e9, "cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}


def _pcts(samples_ns: list[int]) -> dict:
    s = sorted(samples_ns)
    return {"p50_us": s[len(s) // 2] / 1e3, "p99_us": s[int(len(s) * 0.99)] / 1e3, "mean_us": statistics.fmean(s) / 1e3}


def bench_decide(quick: bool) -> dict:
    from kvmesh.router.routing.kv_router import KVRouter

    rng = random.Random(2)
    router = KVRouter(BS)  # predictions on, as in the HTTP router
    for r in range(64):
        router.add_replica(str(r))
    _, _, prompt = _populated(64, 256, rng, index=router.index)
    n = 1000 if quick else 10000
    stages = {"hash": [], "match": [], "score": [], "total": []}
    cpu = []
    for _ in range(n):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        d = router.route(prompt)
        stages["total"].append(time.perf_counter_ns() - t0)
        cpu.append(time.thread_time_ns() - c0)
        for k, v in d.timings_ns.items():
            stages[k].append(v)
    out = {"prompt_tokens": len(prompt), "replicas": 64, **{k: _pcts(v) for k, v in stages.items()},
           "total_cpu_time": _pcts(cpu), "target_total_p99_us": 100}
    out["tokenize"] = bench_tokenize(quick)
    return out


def _stories_tokenizer():
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    path = stories_model()
    return load_tokenizer(path, max_model_len=8192) if (path / "tokenizer.json").exists() else None


def story_text(tok, num_tokens: int) -> str:
    words = ["once", "upon", "a", "time", "there", "was", "a", "little", "girl", "who", "loved", "to", "play", "in",
             "the", "park", "with", "her", "dog"]
    rng = random.Random(3)
    text = " ".join(rng.choice(words) for _ in range(num_tokens))
    while len(tok.encode(text)) > num_tokens:
        text = text[: int(len(text) * 0.98)]
    return text


def bench_tokenize(quick: bool) -> dict:
    tok = _stories_tokenizer()
    if tok is None:
        return {"skipped": "stories260K tokenizer not found"}
    text = story_text(tok, 4096)
    n = 50 if quick else 300
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ids = tok.render_completion(text)
        samples.append(time.perf_counter_ns() - t0)
    return {"prompt_tokens": len(ids), **_pcts(samples)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench router", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/router.json")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    ap.add_argument("--skip-http", action="store_true", help="skip the added-latency benchmark")
    ap.add_argument("--only", choices=["ingest", "match", "decide", "latency"], help="run one part")
    args = ap.parse_args(argv)
    results = {"calibration": calibration()}
    print(json.dumps(results, indent=1), flush=True)
    for name, fn in (("ingest", bench_ingest), ("match", bench_match), ("decide", bench_decide)):
        if args.only and args.only != name:
            continue
        print(f"[router bench] {name} ...", flush=True)
        results[name] = fn(args.quick)
        print(json.dumps(results[name], indent=1), flush=True)
    if not args.skip_http and args.only in (None, "latency"):
        print("[router bench] latency ...", flush=True)
        results["latency"] = measure_added_latency(_stories_tokenizer, story_text, 100 if args.quick else 500)
        print(json.dumps(results["latency"], indent=1), flush=True)
    results["calibration"]["load_average_1m_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"[router bench] wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
