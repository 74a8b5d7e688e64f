"""The simulated replicas' real KV events keep the real router index in step with their pools."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.config import SimConfig, sim_engine
from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.sim.run import run_policy
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord
from kvmesh.kvcache.hashing import external_hash


def _trace(n: int = 60) -> list[MooncakeRecord]:
    # 6 "sessions" whose requests extend a shared prefix; 32-token blocks, one per hash id
    recs = []
    for i in range(n):
        s = i % 6
        depth = 2 + (i // 6) % 4
        ids = tuple(100 * s + k for k in range(depth)) + (10_000 + i,)
        recs.append(MooncakeRecord(i * 20.0, len(ids) * 32 - 5, 3, ids))
    return recs


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_index_ends_holding_exactly_what_the_pools_hold(delay):
    cfg = SimConfig(num_replicas=3, engine=sim_engine(block_size=32, max_num_batched_tokens=256),
                    blocks_per_replica=12, vocab_size=256, event_delay_s=delay)
    reqs = requests_from_mooncake(_trace(), 1.0, 32, trace_block_tokens=32)
    run = run_policy("cache_aware", reqs, cfg, 12, BlockTokenCache(32, 256))
    index = run.router.index
    evicted_somewhere = False
    for rep in run.replicas:
        pool = rep.kv.block_pool
        cached = {external_hash(h) for h in pool.cached_block_hash_to_block}
        assert index.cached_hashes(rep.replica_id) == cached
        rep.kv.check_integrity()
        evicted_somewhere |= index.stats.blocks_removed > 0
    assert evicted_somewhere, "the trace should overflow the small pools"
    assert run.router.num_events == index.stats.events > 0


def test_router_sends_a_session_back_to_its_prefix():
    cfg = SimConfig(num_replicas=3, engine=sim_engine(block_size=32, max_num_batched_tokens=256),
                    blocks_per_replica=40, vocab_size=256)
    reqs = requests_from_mooncake(_trace(), 1.0, 32, trace_block_tokens=32)
    run = run_policy("cache_aware", reqs, cfg, 40, BlockTokenCache(32, 256))
    replica_of_session: dict[int, set] = {}
    for i, r in enumerate(run.requests):
        replica_of_session.setdefault(i % 6, set()).add(r.replica_id)
    assert all(len(s) == 1 for s in replica_of_session.values())
    later = run.requests[6:]
    assert all(r.num_cached_tokens >= 64 for r in later)
