"""Hit-rate ceilings use the engine's accounting: full blocks only, at least one token computed."""

from __future__ import annotations

from kvmesh.cluster.measure.sim.replica import SimRequest
from kvmesh.cluster.measure.sim.report import capped_hit_tokens, infinite_hit_rate, single_pool_hit_rate
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache


def _r(i, ids, n, out=1):
    return SimRequest(f"r{i}", float(i), tuple(ids), n, out)


def test_fully_cached_block_aligned_prompt_recomputes_its_last_block():
    assert capped_hit_tokens(4, 64, 16) == 48
    assert capped_hit_tokens(4, 70, 16) == 64
    assert capped_hit_tokens(2, 70, 16) == 32


def test_infinite_cache_counts_repeated_full_block_prefixes():
    reqs = [_r(0, [1, 2, 3], 40), _r(1, [1, 2, 4], 40), _r(2, [5, 2, 3], 40)]
    # request 1 reuses blocks 1, 2 (32 tokens); request 2 starts with a new block: nothing
    assert infinite_hit_rate(reqs, 16) == 32 / 120


def test_single_pool_matches_infinite_when_nothing_is_evicted_and_falls_below_when_small():
    tokens = BlockTokenCache(16, 256)
    reqs = [_r(i, [i % 3, 10 + i % 3, 20 + i], 40) for i in range(12)]
    inf = infinite_hit_rate(reqs, 16)
    assert single_pool_hit_rate(reqs, 64, 16, tokens) == inf > 0
    assert single_pool_hit_rate(reqs, 3, 16, tokens) < inf
