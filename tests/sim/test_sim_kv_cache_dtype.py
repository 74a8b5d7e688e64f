"""The simulator's KV bytes follow the replicas' KV cache dtype: an FP8 cache holds and moves half the bf16 bytes per
token, so the same memory per replica holds twice the blocks and a transfer takes half the per-token time."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kvmesh.cluster.measure.sim.config import SimConfig, cache_bytes_per_token, sim_engine
from kvmesh.cluster.measure.sim.run import blocks_per_replica
from kvmesh.cluster.measure.sim.transfer import transfer_s
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord


def config(kv_cache_dtype: str, **kw) -> SimConfig:
    return SimConfig(engine=replace(sim_engine(), kv_cache_dtype=kv_cache_dtype), **kw)


def test_an_fp8_cache_holds_and_moves_half_the_bytes_per_token():
    bf16, fp8 = config("auto"), config("fp8")
    assert cache_bytes_per_token(bf16) == 131_072 and cache_bytes_per_token(fp8) == 65_536
    per_token = lambda c: transfer_s(c, 1000) - transfer_s(c, 0)  # noqa: E731
    assert per_token(fp8) == pytest.approx(per_token(bf16) / 2)


def test_the_same_memory_per_replica_holds_twice_the_fp8_blocks():
    trace = [MooncakeRecord(timestamp_ms=0, input_length=512, output_length=1, hash_ids=[1])]
    bf16 = blocks_per_replica(config("auto", kv_cache_memory_per_replica="24GiB"), trace)
    assert bf16 == 24 * 2**30 // (131_072 * 512) == 384
    assert blocks_per_replica(config("fp8_e5m2", kv_cache_memory_per_replica="24GiB"), trace) == 2 * bf16


def test_memory_and_a_block_count_together_are_refused():
    with pytest.raises(ValueError, match="kv_cache_memory_per_replica or blocks_per_replica, not both"):
        config("fp8", kv_cache_memory_per_replica="1GiB", blocks_per_replica=10)
    with pytest.raises(ValueError, match="kv_cache_memory_per_replica='lots' is not a size"):
        config("fp8", kv_cache_memory_per_replica="lots")
