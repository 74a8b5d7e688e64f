"""Engines sharing one GPU in one process (``gpu``; the arithmetic is tested on CPU with injected device
facts in test_device_paths.py): each takes its gpu_memory_utilization share, another engine's memory
does not count against it, shares that overcommit the device are refused with a clear error, and
kv_cache_memory caps an engine's cache on CUDA as it sizes it on CPU."""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.worker.kv_cache import bytes_per_block
from kvmesh.replica.worker.model_runner import ModelRunner

from ..conftest import TEST_KV_CACHE_MEMORY
from .engine_paths import free_cuda_memory

pytestmark = pytest.mark.gpu
SHARE = 0.15  # two of them and the overcommitting third stay well inside an 80 GB card's other tenants


def runner(stories_path, **kw) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(stories_path), dtype="float32", device="cuda",
                                    attention_backend="torch", **kw))


def kv_bytes(r: ModelRunner) -> int:
    return r.kv_cache.numel() * r.kv_cache.element_size()


def test_two_engines_in_one_process_each_take_their_share(stories_path):
    free_cuda_memory()
    total = torch.cuda.mem_get_info()[1]
    first = runner(stories_path, gpu_memory_utilization=SHARE)
    second = runner(stories_path, gpu_memory_utilization=SHARE)
    for r in (first, second):  # the share less weights, activations and the CUDA context
        assert 0.8 * SHARE * total < kv_bytes(r) <= SHARE * total
    assert abs(first.num_kv_blocks - second.num_kv_blocks) <= 0.05 * first.num_kv_blocks
    with pytest.raises(ValueError, match="engines on one device must share it"):
        runner(stories_path, gpu_memory_utilization=0.85)  # 0.85 of the card is not free beside two engines
    capped = runner(stories_path, gpu_memory_utilization=0.85, kv_cache_memory=TEST_KV_CACHE_MEMORY)
    attn = capped.model.attention_layers()[0]
    block = bytes_per_block(capped.spec.num_hidden_layers, capped.block_size, attn.num_kv_heads, attn.head_dim,
                            torch.float32)
    assert capped.num_kv_blocks == TEST_KV_CACHE_MEMORY // block
    del first, second, capped
    free_cuda_memory()


def test_an_engine_gives_its_memory_back(stories_path):
    free_cuda_memory()
    free_before = torch.cuda.mem_get_info()[0]
    r = runner(stories_path, gpu_memory_utilization=SHARE)
    assert torch.cuda.mem_get_info()[0] < free_before - 0.8 * SHARE * torch.cuda.mem_get_info()[1]
    del r
    free_cuda_memory()
    assert torch.cuda.mem_get_info()[0] > free_before - 2**30  # the next engine finds the card as it was
