"""Benchmark of the KV cache: hashing, pool churn, miss lookups, and trace hit rates per eviction policy.

    kvmesh bench kvcache [--trace PATH] [--out results/kvcache.json] [--pool-blocks 16384 65536 ...]

Micro-benchmarks (best of ``--repeat`` runs, one core): block hashing in 16-token blocks/s;
allocate + cache + free through the block pool in blocks/s; ``get_computed_blocks`` on a miss in
microseconds per block (hashing included). Then the Mooncake trace is replayed into one pool per
size and policy, one request at a time (lookup, allocate, cache, free), and the prefix hit rate in
tokens is compared with the infinite-cache ceiling. Writes JSON and a PNG plot beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.workloads.traces import default_trace, read_mooncake
from kvmesh.kvcache.block_pool import BlockPool
from kvmesh.kvcache.hashing import RequestBlockHasher, make_none_hash
from kvmesh.kvcache.interfaces import TokenRequest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.kvcache.pool_integrity import check_pool_integrity

DEFAULT_TRACE = Path(default_trace())
DEFAULT_POOL_BLOCKS = [12_288, 49_152, 196_608, 393_216, 786_432, 1_572_864]
POLICIES = ["lru", "slru", "arc"]
SEED = b"kvmesh-bench-seed"
VOCAB_SIZE = 32_000
PAPER_CEILING = 0.6512  # traces/README.md: tokens repeating an earlier request's prefix


def best_of(repeat: int, fn) -> tuple[float, float]:
    """The fastest of ``repeat`` calls of ``fn``: (seconds of this process's CPU time, wall seconds).

    CPU time is the headline: on a shared machine other processes steal the core, and the
    question asked is what one core can do. Wall time is kept for honesty.
    """
    best_cpu = best_wall = float("inf")
    for _ in range(repeat):
        t0, w0 = time.process_time(), time.perf_counter()
        fn()
        best_cpu = min(best_cpu, time.process_time() - t0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return best_cpu, best_wall


def random_prompts(num: int, tokens: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(VOCAB_SIZE) for _ in range(tokens)] for _ in range(num)]


def bench_hashing(block_size: int, repeat: int) -> dict:
    """Prefill: 64 prompts of 1024 blocks through RequestBlockHasher; decode: one token per extend."""
    prompts = random_prompts(64, 1024 * block_size, random.Random(1))
    none_hash = make_none_hash(SEED)

    def prefill():
        for p in prompts:
            RequestBlockHasher(block_size, none_hash).extend(p)

    decode_tokens = prompts[0][: 256 * block_size]

    def decode():
        hasher, so_far = RequestBlockHasher(block_size, none_hash), []
        for token in decode_tokens:
            so_far.append(token)
            hasher.extend(so_far)

    num_blocks = 64 * 1024
    t, wall = best_of(repeat, prefill)
    t_decode, _ = best_of(repeat, decode)
    return {"blocks": num_blocks, "cpu_seconds": t, "blocks_per_s": num_blocks / t,
            "blocks_per_s_wall": num_blocks / wall,
            "decode_us_per_token": t_decode / len(decode_tokens) * 1e6}


def bench_pool_churn(block_size: int, repeat: int) -> dict:
    """allocate + cache_full_blocks + free of 64-block requests through a 16k-block pool (evicting)."""
    none_hash = make_none_hash(SEED)
    prompts = random_prompts(256, 64 * block_size, random.Random(2))
    hashes = [RequestBlockHasher(block_size, none_hash).extend(p) for p in prompts]
    pool = BlockPool(16_384, block_size)

    def run():
        for p, h in zip(prompts, hashes, strict=True):
            blocks = pool.get_new_blocks(64)
            pool.cache_full_blocks(blocks, h, 0, 64, p)
            pool.free_blocks(reversed(blocks))

    for _ in range(2):
        run()  # warm up: later rounds recycle cached blocks, i.e. evict
    t, wall = best_of(repeat, run)
    num_blocks = 256 * 64
    check_pool_integrity(pool)
    return {"blocks": num_blocks, "cpu_seconds": t, "blocks_per_s": num_blocks / t,
            "blocks_per_s_wall": num_blocks / wall}


def bench_miss_lookup(block_size: int, repeat: int) -> dict:
    """get_computed_blocks for unique prompts (a 0% hit rate) against a populated cache."""
    manager = KVCacheManager(65_536, block_size, SEED)
    rng = random.Random(3)
    for i, p in enumerate(random_prompts(32, 1024 * block_size, rng)):
        req = TokenRequest(f"warm{i}", p)
        manager.allocate_slots(req, req.num_tokens)
        manager.free(req)
    prompts = random_prompts(64, 1024 * block_size, rng)
    counter = [0]

    def run():
        for p in prompts:
            counter[0] += 1
            req = TokenRequest(f"miss{counter[0]}", p)
            manager.get_computed_blocks(req)
            manager.free(req)  # drops the hasher (never allocated)

    t, wall = best_of(repeat, run)
    num_blocks = 64 * 1024
    return {"blocks": num_blocks, "cpu_seconds": t, "us_per_block": t / num_blocks * 1e6,
            "us_per_block_wall": wall / num_blocks * 1e6}


def trace_hashes(records, token_cache, block_size: int) -> tuple[list[list[bytes]], float]:
    """Every request's block hashes (computed once, shared by all replays), and the hashing time."""
    none_hash = make_none_hash(SEED)
    interned: dict[bytes, bytes] = {}
    out, seconds = [], 0.0
    for rec in records:
        tokens = token_cache.prompt(rec.hash_ids, rec.input_length)
        t0 = time.process_time()
        hashes = RequestBlockHasher(block_size, none_hash).extend(tokens)
        seconds += time.process_time() - t0
        out.append([interned.setdefault(h, h) for h in hashes])
    return out, seconds


def infinite_ceiling(records, hashes: list[list[bytes]], block_size: int) -> float:
    """Hit rate in tokens of an infinite cache with the same lookup rules (block granular, capped)."""
    seen: set[bytes] = set()
    hits = queries = 0
    for rec, hs in zip(records, hashes, strict=True):
        n = 0
        for h in hs[: (rec.input_length - 1) // block_size]:
            if h not in seen:
                break
            n += 1
        hits += n * block_size
        queries += rec.input_length
        seen.update(hs)
    return hits / queries


def replay(records, hashes, token_cache, num_blocks: int, policy: str, block_size: int) -> dict:
    """One pool, requests one at a time: lookup, allocate + cache, free. Hit rate in tokens."""
    manager = KVCacheManager(num_blocks, block_size, SEED, eviction_policy=policy)
    # Millions of long-lived blocks make every full GC pass walk them all; a server calls
    # gc.freeze() after start-up for the same reason (vLLM does). Nothing here makes cycles.
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        for i, (rec, hs) in enumerate(zip(records, hashes, strict=True)):
            req = TokenRequest(f"r{i}", token_cache.prompt(rec.hash_ids, rec.input_length))
            # Share the precomputed hashes: the replays measure the pool, not the hashing.
            hasher = RequestBlockHasher(block_size, manager.none_hash)
            hasher.block_hashes = hs
            manager.req_to_hasher[req.request_id] = hasher
            computed, num_computed = manager.get_computed_blocks(req)
            if manager.allocate_slots(req, req.num_tokens - num_computed, num_computed, computed) is None:
                raise RuntimeError(f"pool of {num_blocks} blocks cannot hold a {req.num_tokens}-token request")
            manager.free(req)
        cpu_seconds = time.process_time() - t0
    finally:
        gc.enable()
    stats = manager.prefix_cache_stats
    return {"policy": policy, "num_blocks": num_blocks, "pool_tokens": num_blocks * block_size,
            "hit_rate": stats.hit_rate, "hit_tokens": stats.hits, "query_tokens": stats.queries,
            "cpu_seconds": cpu_seconds, "blocks_per_s": sum(len(h) for h in hashes) / cpu_seconds}


def bench_trace(trace: Path, pool_sizes: list[int], block_size: int, limit: int | None) -> dict:
    from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache

    records = read_mooncake(trace, limit=limit)
    token_cache = BlockTokenCache(512, VOCAB_SIZE)
    hashes, hash_seconds = trace_hashes(records, token_cache, block_size)
    num_hashed = sum(len(h) for h in hashes)
    ceiling = infinite_ceiling(records, hashes, block_size)
    distinct = len({h for hs in hashes for h in hs})
    need = max(-(-r.input_length // block_size) for r in records) + 1
    print(f"trace: {len(records)} requests, {num_hashed} blocks hashed at "
          f"{num_hashed / hash_seconds / 1e6:.2f} M blocks/s, {distinct} distinct, ceiling {ceiling:.4f}",
          flush=True)
    runs = []
    for num_blocks in pool_sizes:
        if num_blocks < need:
            print(f"  skip pool of {num_blocks} blocks: the longest request needs {need}", flush=True)
            continue
        for policy in POLICIES:
            result = replay(records, hashes, token_cache, num_blocks, policy, block_size)
            runs.append(result)
            print(f"  {policy:5s} {num_blocks:>9,d} blocks ({num_blocks / distinct:6.1%} of distinct): "
                  f"hit rate {result['hit_rate']:.4f}  [{result['cpu_seconds']:.1f} s CPU]", flush=True)
    return {"trace": str(trace), "requests": len(records), "block_size": block_size,
            "hashed_blocks": num_hashed, "hash_blocks_per_s": num_hashed / hash_seconds,
            "distinct_blocks": distinct, "infinite_cache_hit_rate": ceiling,
            "readme_ceiling": PAPER_CEILING, "runs": runs}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = results["trace_replay"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in POLICIES:
        runs = [r for r in trace["runs"] if r["policy"] == policy]
        ax.plot([r["num_blocks"] for r in runs], [100 * r["hit_rate"] for r in runs], "o-", label=policy)
    ax.axhline(100 * trace["infinite_cache_hit_rate"], ls="--", c="gray",
               label=f"infinite cache ({100 * trace['infinite_cache_hit_rate']:.2f}%)")
    ax.axvline(trace["distinct_blocks"], ls=":", c="gray", label="distinct blocks in trace")
    ax.set_xscale("log")
    ax.set_xlabel(f"pool size (blocks of {trace['block_size']} tokens)")
    ax.set_ylabel("prefix hit rate (% of prompt tokens)")
    micro = results["micro"]
    ax.set_title(f"Mooncake replay, one pool — hashing {micro['hashing']['blocks_per_s'] / 1e6:.2f} M blk/s, "
                 f"churn {micro['pool_churn']['blocks_per_s'] / 1e3:.0f} k blk/s", fontsize=9)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench kvcache",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/kvcache.json"), help="JSON output path")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake JSONL trace")
    parser.add_argument("--pool-blocks", type=int, nargs="+", default=DEFAULT_POOL_BLOCKS,
                        help="pool sizes (blocks) for the trace replay")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per micro-benchmark (best kept)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--skip-trace", action="store_true", help="micro-benchmarks only")
    args = parser.parse_args(argv)
    if args.block_size <= 0 or args.repeat <= 0:
        parser.error("--block-size and --repeat must be positive")

    micro = {}
    for name, fn in (("hashing", bench_hashing), ("pool_churn", bench_pool_churn),
                     ("miss_lookup", bench_miss_lookup)):
        micro[name] = fn(args.block_size, args.repeat)
        print(f"{name}: {json.dumps(micro[name])}", flush=True)
    results = {"machine": {"python": sys.version.split()[0], "platform": platform.platform()},
               "block_size": args.block_size, "micro": micro}
    if not args.skip_trace:
        if not args.trace.is_file():
            print(f"trace not found at {args.trace}; pass --trace or --skip-trace", file=sys.stderr)
            return 2
        results["trace_replay"] = bench_trace(args.trace, args.pool_blocks, args.block_size, args.limit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if "trace_replay" in results:
        plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
