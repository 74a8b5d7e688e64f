"""The kvcache benchmark's Mooncake replay: a pool big enough for everything reaches the ceiling."""

import pytest
from kvmesh.cluster.measure.benchmarks import kvcache as bench
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.traces import read_mooncake


@pytest.fixture(scope="module")
def small_trace(mooncake_trace):
    # Short requests only, to stay fast; several of them share prefixes (the first at line 59).
    records = [r for r in read_mooncake(mooncake_trace, limit=300) if r.input_length <= 4096]
    token_cache = BlockTokenCache(512, bench.VOCAB_SIZE)
    hashes, _ = bench.trace_hashes(records, token_cache, 16)
    return records, token_cache, hashes


@pytest.mark.parametrize("policy", bench.POLICIES)
def test_a_pool_holding_every_block_reaches_the_infinite_cache_ceiling(small_trace, policy):
    records, token_cache, hashes = small_trace
    distinct = len({h for hs in hashes for h in hs})
    result = bench.replay(records, hashes, token_cache, distinct + 1, policy, 16)
    assert result["hit_rate"] == pytest.approx(bench.infinite_ceiling(records, hashes, 16))
    assert result["hit_rate"] > 0


def test_a_smaller_pool_never_beats_the_ceiling(small_trace):
    records, token_cache, hashes = small_trace
    need = max(len(hs) for hs in hashes) + 2
    result = bench.replay(records, hashes, token_cache, need, "lru", 16)
    assert result["hit_rate"] <= bench.infinite_ceiling(records, hashes, 16)
