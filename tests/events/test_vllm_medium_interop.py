"""The tiers as vLLM's own event classes decode them: the device pool's blocks carry medium "GPU" on
every device and the host tier's "CPU" (skips without vllm installed)."""

from __future__ import annotations

import msgspec
import pytest
from kvmesh.events.schema import KVEventBatch
from kvmesh.kvcache.interfaces import TokenRequest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

kv_events = pytest.importorskip("vllm.distributed.kv_events")


def test_vllm_decodes_device_blocks_as_gpu_and_host_tier_blocks_as_cpu():
    events: list = []
    manager = KVCacheManager(4, 4, b"seed", event_sink=events.append, num_host_blocks=8)
    a = TokenRequest("a", list(range(9)))
    computed, n = manager.get_computed_blocks(a)
    manager.allocate_slots(a, a.num_tokens - n, n, computed)
    manager.complete_offload_stores([manager.take_offload_copies().job_id])
    manager.free(a)
    b = TokenRequest("b", [50] * 9)  # recycles the device blocks: BlockRemoved "GPU"
    computed, n = manager.get_computed_blocks(b)
    manager.allocate_slots(b, b.num_tokens - n, n, computed)
    wire = msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=events, data_parallel_rank=0))
    decoded = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch).decode(wire)
    media = [(type(e).__name__, e.medium) for e in decoded.events]
    assert media[:2] == [("BlockStored", "GPU"), ("BlockStored", "CPU")]
    assert ("BlockRemoved", "GPU") in media and ("BlockRemoved", "CPU") not in media
