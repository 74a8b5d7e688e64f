"""Hit-rate ceilings a router is measured against, on the same trace and block accounting.

- *infinite*: one cache that never evicts: every full block seen before is a hit.
- *single pool*: one real ``KVCacheManager`` with the cluster's total capacity, requests served
  one after another in arrival order (no in-flight pinning): what a perfect router would get if
  the cluster's memory were one LRU pool.

Accounting matches the engine: only full blocks are cached, a request reuses its longest cached
prefix, and at least one prompt token is always computed (a fully cached, block-aligned prompt
recomputes its last block), so hits are capped at ``num_prompt_tokens - 1`` rounded to blocks.
"""

from __future__ import annotations

from kvmesh.cluster.benchmarks.traces import BlockTokenCache
from kvmesh.cluster.sim.request import SimRequest


def capped_hit_tokens(num_matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """Tokens reused by a request whose first ``num_matched_blocks`` blocks are cached."""
    return min(num_matched_blocks, (num_prompt_tokens - 1) // block_size) * block_size


def infinite_hit_rate(requests: list[SimRequest], block_size: int) -> float:
    seen: set[int] = set()  # hash ids are chained: an id names its whole prefix
    hit = total = 0
    for r in requests:
        full = r.hash_ids[: r.num_prompt_tokens // block_size]
        m = 0
        while m < len(full) and full[m] in seen:
            m += 1
        hit += capped_hit_tokens(m, r.num_prompt_tokens, block_size)
        total += r.num_prompt_tokens
        seen.update(full)
    return hit / total if total else 0.0


def single_pool_hit_rate(requests: list[SimRequest], num_blocks: int, block_size: int,
                         tokens: BlockTokenCache, hash_seed: bytes = b"\0" * 32) -> float:
    """Replay through one real KVCacheManager of ``num_blocks`` usable blocks."""
    hits = single_pool_hits(requests, num_blocks, block_size, tokens, hash_seed)
    total = sum(r.num_prompt_tokens for r in requests)
    return sum(hits) / total if total else 0.0


def single_pool_hits(requests: list[SimRequest], num_blocks: int, block_size: int,
                     tokens: BlockTokenCache, hash_seed: bytes = b"\0" * 32) -> list[int]:
    """Cached tokens of each request (in order) in one real KVCacheManager of ``num_blocks`` blocks."""
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager

    kv = KVCacheManager(num_blocks + 1, block_size, hash_seed)
    hits = []
    for r in requests:
        req = SimRequest(r.request_id, r.arrival_s, r.hash_ids, r.num_prompt_tokens, r.max_output_tokens)
        req.all_token_ids = tokens.prompt(r.hash_ids, r.num_prompt_tokens)
        computed, num_cached = kv.get_computed_blocks(req)
        num_new = req.num_prompt_tokens + req.max_output_tokens - num_cached
        if kv.allocate_slots(req, num_new, num_cached, computed) is None:
            raise ValueError(f"{r.request_id} does not fit a single pool of {num_blocks} blocks")
        kv.free(req)
        hits.append(num_cached)
    return hits
