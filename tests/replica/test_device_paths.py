"""The GPU-only code paths, run on CPU with the device facts injected.

KV sizing from gpu_memory_utilization (after a real profiling forward), CUDA device choice per TP
rank, the NCCL process-group arguments, and where every step tensor is born: the runner's inputs,
both attention backends' metadata and the sampling tensors are built for the ``meta`` device here,
so a tensor left on the CPU (a forgotten ``.to(device)``) fails the test as it would fail on a GPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys

import pytest
import torch
from kvmesh.replica.attention import flash_attn_reference
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.distributed.utils import DistributedInit, cuda_device_index, process_group_args
from kvmesh.replica.sample.sampler import build_sampling_metadata
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.input_batch import InputBatch
from kvmesh.replica.worker.kv_cache import (
    DeviceMemory,
    bytes_per_block,
    kv_cache_budget,
    module_bytes,
    num_blocks_for_budget,
)
from kvmesh.replica.worker.model_runner import ModelRunner

GIB = 2**30
META = torch.device("meta")


# -- KV sizing -------------------------------------------------------------------------------------


def facts(total=80, free=None, peak=0.0, reserved=0.0, allocated=0.0, outside=0.0) -> DeviceMemory:
    """Device facts in GiB; ``free`` defaults to what this process and ``outside`` leave."""
    free = total - reserved - outside if free is None else free
    return DeviceMemory(*(int(x * GIB) for x in (total, free, peak, reserved, allocated)))


def test_kv_budget_is_the_utilization_share_less_weights_activations_and_other_users():
    # an 80 GiB GPU at 0.9: 16 GiB weights + 2 GiB activations peak, 1.5 GiB CUDA context / others
    before = facts(peak=16, reserved=16, allocated=16, outside=1.5)
    after = facts(peak=18, reserved=18, allocated=16, outside=1.5)
    assert after.non_torch == int(1.5 * GIB)
    budget = kv_cache_budget(before, after, 16 * GIB, 0.9)
    assert budget == int(72 * GIB - 16 * GIB - 2 * GIB - 1.5 * GIB)
    # Llama-3-8B in bf16: 32 layers x 8 KV heads x 128 dims x K,V x 16 tokens x 2 bytes = 2 MiB per block
    block = bytes_per_block(32, 16, 8, 128, torch.bfloat16)
    assert block == 2 * 2**20
    assert num_blocks_for_budget(budget, block, 16, 8192) == budget // (2 * 2**20) == 26880


def test_kv_cache_memory_caps_the_profiled_budget():
    before, after = facts(peak=1, reserved=1, allocated=1), facts(peak=2, reserved=2, allocated=1)
    assert kv_cache_budget(before, after, GIB, 0.5, cap=4 << 20) == 4 << 20
    assert kv_cache_budget(before, after, GIB, 0.5, cap=100 * GIB) == 40 * GIB - 2 * GIB  # the share is smaller
    with pytest.raises(ValueError, match="leaves no room"):  # a cap does not make an impossible share possible
        kv_cache_budget(before, after, GIB, 0.02, cap=4 << 20)


def test_other_engines_in_the_process_do_not_count_against_this_ones_share():
    # engine 1 holds 1 GiB of weights + a 30 GiB KV cache; engine 2 (1 GiB weights) profiles 2 GiB of activations
    before = facts(peak=32, reserved=32, allocated=32, outside=0.5)
    after = facts(peak=34, reserved=34, allocated=32, outside=0.5)
    assert kv_cache_budget(before, after, GIB, 0.4) == int(32 * GIB - GIB - 2 * GIB - 0.5 * GIB)


def test_engines_whose_shares_overcommit_the_device_get_a_clear_error():
    # engine 1 took 0.9 of the card; engine 2 asks for 0.9 too: its share is computed, but is not free
    before = facts(peak=72, reserved=72, allocated=72, outside=0.5)
    after = facts(peak=74, reserved=74, allocated=72, outside=0.5)
    with pytest.raises(ValueError, match=r"asks for a 68.5 GiB KV cache but only 5.5 GiB .*\(71.0 GiB held by "
                                         "other engines in this process.* lower gpu_memory_utilization"):
        kv_cache_budget(before, after, GIB, 0.9)
    assert kv_cache_budget(before, after, GIB, 0.9, cap=GIB) == GIB  # an explicit small cache fits


def test_no_room_for_the_kv_cache_is_a_clear_error():
    before = facts(total=24, peak=18, reserved=19, allocated=18, outside=3)
    after = facts(total=24, peak=20, reserved=21, allocated=18, outside=1)
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.5 of 24.0 GiB leaves no room"):
        kv_cache_budget(before, after, 18 * GIB, 0.5)


@pytest.mark.parametrize("backend", ["torch", "flash_attn"])
def test_profiled_kv_budget_runs_the_profiling_forward_then_sizes_from_the_facts(stories_path, monkeypatch,
                                                                                 backend):
    if backend == "flash_attn":
        import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)

        monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module(allow_float32=True))
    runner = ModelRunner(EngineConfig(model=str(stories_path), dtype="float32", device="cpu", kv_cache_memory=1 << 22,
                                      attention_backend=backend, max_num_batched_tokens=700, max_num_seqs=4,
                                      gpu_memory_utilization=0.5))
    seen, calls = [], []
    forward = runner.model.forward
    runner.model.forward = lambda ids, pos, md: seen.append(ids.numel()) or forward(ids, pos, md)
    runner.reset_peak_memory = lambda device: calls.append(("reset", device))
    weights = module_bytes(runner.model)
    assert weights == sum(p.numel() * 4 for p in runner.model.parameters()) + sum(
        b.numel() * b.element_size() for b in runner.model.buffers())
    # another engine's 1 GiB is held in this process; this engine's forward peaks 256 MiB above what was held
    held = GIB + weights
    reads = iter([DeviceMemory(4 * GIB, 2 * GIB, held, held, held),
                  DeviceMemory(4 * GIB, 2 * GIB, held + GIB // 4, held + GIB // 4, held)])
    runner.read_device_memory = lambda device: calls.append(("read", device)) or next(reads)
    budget = runner.profiled_kv_budget()
    assert seen == [700]  # one forward over the whole token budget (two sequences: 512 + 188)
    assert [c[0] for c in calls] == ["read", "reset", "read"]  # facts before, peak reset, the forward, facts after
    non_torch = 2 * GIB - GIB // 4 - held
    assert budget == 2 * GIB - weights - GIB // 4 - non_torch
    calls.clear()
    reads = iter([DeviceMemory(4 * GIB, 2 * GIB, held, held, held),
                  DeviceMemory(4 * GIB, 2 * GIB, held + GIB // 4, held + GIB // 4, held)])
    assert runner.profiled_kv_budget(cap=1 << 20) == 1 << 20


def test_kv_cache_memory_reaches_the_cuda_budget_per_rank(stories_path):
    """On CUDA ``_size_kv_cache`` passes kv_cache_memory (this rank's part) as the cap of the profiled budget."""
    runner = ModelRunner(EngineConfig(model=str(stories_path), dtype="float32", device="cpu", kv_cache_memory=3 << 20))
    caps = []
    runner.device = torch.device("cuda")  # only the branch is taken; the profiling itself is stubbed
    runner.profiled_kv_budget = lambda cap: caps.append(cap) or min(cap or GIB, GIB)
    attn = runner.model.attention_layers()[0]
    block = bytes_per_block(runner.spec.num_hidden_layers, 16, attn.num_kv_heads, attn.head_dim, torch.float32)
    assert runner._size_kv_cache() == (3 << 20) // block and caps == [3 << 20]
    runner.config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu")
    assert runner._size_kv_cache() == GIB // block and caps == [3 << 20, None]


# -- CUDA device per rank, NCCL arguments ---------------------------------------------------------


def test_each_tp_rank_takes_its_own_gpu():
    assert [cuda_device_index(r, 1) for r in range(4)] == [0, 0, 0, 0]  # Ray: each actor sees its one GPU
    assert [cuda_device_index(r, 4) for r in range(4)] == [0, 1, 2, 3]  # one process per GPU on one node
    with pytest.raises(ValueError, match="rank 4 sees 4 CUDA devices"):
        cuda_device_index(4, 4)  # would share GPU 0 with rank 0
    with pytest.raises(ValueError, match="sees no CUDA device"):
        cuda_device_index(0, 0)


def test_nccl_process_group_arguments():
    init = DistributedInit("10.0.0.7", 29500, world_size=2, backend="nccl", timeout_s=30)
    assert process_group_args(init, 1) == dict(backend="nccl", init_method="tcp://10.0.0.7:29500", world_size=2,
                                               rank=1, timeout=datetime.timedelta(seconds=30))
    v6 = DistributedInit("fd00::7", 29500, world_size=2, backend="nccl")
    assert process_group_args(v6, 0)["init_method"] == "tcp://[fd00::7]:29500"
    with pytest.raises(ValueError, match="outside the group"):
        process_group_args(init, 2)


# -- every step tensor on the runner's device -----------------------------------------------------


def tensors_of(obj, path="md"):
    """(path, tensor) of every tensor reachable through dataclass fields and lists."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from tensors_of(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, list | tuple):
        for i, x in enumerate(obj):
            yield from tensors_of(x, f"{path}[{i}]")


def off_device(obj) -> list[str]:
    return [f"{p} on {t.device}" for p, t in tensors_of(obj) if t.device != META]


def step_on_meta(block_size: int) -> SchedulerOutput:
    greedy, hot = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9, top_k=5)
    return SchedulerOutput([
        ScheduledRequest("decode", [5], 2 * block_size + 3, [3, 4, 5], True, hot, [1, 2]),
        ScheduledRequest("fresh", list(range(1, 10)), 0, [6], True, greedy),
        ScheduledRequest("prefix-hit", [7, 8, 9], block_size, [1, 2], True, greedy),
    ], 13)


@pytest.mark.parametrize("block_size", [16, 256])
def test_step_inputs_and_attention_metadata_live_on_the_runner_device(monkeypatch, block_size):
    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module())
    batch = InputBatch(4, 8, block_size, META)
    inputs = batch.prepare(step_on_meta(block_size))
    assert off_device(inputs) == []
    for name in ("torch", "flash_attn"):
        backend = get_attn_backend(name, torch.device("cpu"), torch.bfloat16)
        assert off_device(backend.build(inputs.common)) == [], name
    md = batch.sampling_metadata(inputs.sample_rows, 300, [2])
    assert md.temperature is not None and off_device(md) == []
    full = build_sampling_metadata([SamplingParams(temperature=1.0, top_k=3, top_p=0.5)], [0], 300, [2], META)
    assert off_device(full) == []


def test_kv_cache_and_static_decode_buffers_live_on_the_runner_device(monkeypatch):
    from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode
    from kvmesh.replica.worker.kv_cache import allocate_kv_cache

    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module())
    assert allocate_kv_cache(2, (2, 8, 256, 2, 8), torch.bfloat16, META).device == META
    backend = get_attn_backend("flash_attn", torch.device("cpu"), torch.bfloat16)
    static = StaticDecode(None, backend, max_num_seqs=8, max_blocks=4, block_size=256, device=META, max_seq_len=1024)
    inputs = static.inputs
    buffers = [inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.seq_lens, inputs.block_table]
    assert all(t.device == META for t in buffers)
    assert all(off_device(md) == [] for md in static.metadata.values())
    prefill = static.prefill.inputs  # the prefill graphs' inputs and metadata too (prefill_graph.py)
    buffers = [prefill.input_ids, prefill.positions, prefill.slot_mapping, prefill.query_start_loc, prefill.seq_lens,
               prefill.cu_seqlens_k, prefill.block_table, prefill.last_index, *prefill.sampling()]
    assert all(t.device == META for t in buffers)
    assert all(off_device(md) == [] for md in static.prefill.metadata.values())
