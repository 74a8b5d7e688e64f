"""Block tables stay int32 from the scheduler's block ids to the attention kernels (flash-attn refuses
anything else): the runner's persistent table, the step's metadata, what each backend builds from it,
and the static decode buffers. The CPU twin runs the torch and flash (reference) backends; on a GPU
(``gpu``) every backend, block size and CUDA-graph setting that runs there."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.input_batch import InputBatch

from .engine_paths import BLOCK_SIZES, CUDA_BACKENDS, config, cuda_dtype_or_skip, flash_reference, run, waves


def block_table_tensors(obj, path: str = "md"):
    """(path, tensor) of every tensor named like a block table, through dataclass fields and dicts."""
    if isinstance(obj, torch.Tensor):
        if "block_table" in path:
            yield path, obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from block_table_tensors(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from block_table_tensors(v, f"{path}[{k}]")


def run_recording_block_tables(engine: LLMEngine) -> list[tuple[str, torch.Tensor]]:
    """Runs a workload that hits the prefix cache, chunks, preempts and decodes; returns every block-table
    tensor the attention backend was given or built."""
    runner, seen = engine.model_runner, []
    build = runner.attn_backend.build

    def recording(common):
        md = build(common)
        seen.extend(block_table_tensors(common, "common"))
        seen.extend(block_table_tensors(md, "backend"))
        return md

    runner.attn_backend.build = recording
    bs = runner.block_size
    prompts, lengths = waves(bs)
    prompts[0]["shared"] = [(5 * i) % 500 + 3 for i in range(bs + 20)]
    prompts[1]["hit"] = prompts[0]["shared"][:bs] + [7, 8, 9]  # its first block is a prefix-cache hit
    lengths |= {"shared": 3, "hit": 3}
    done = run(engine, prompts, lengths)
    assert len(done.tokens) == 7 and engine.stats.prefix_cache_hits > 0
    return seen


def check_int32(engine: LLMEngine) -> None:
    runner = engine.model_runner
    seen = run_recording_block_tables(engine)
    assert {p.split(".")[0] for p, _ in seen} >= {"common"}
    wrong = [f"{p}: {t.dtype} on {t.device}" for p, t in seen
             if t.dtype != torch.int32 or t.device.type != runner.device.type]
    assert wrong == []
    assert runner.input_batch.block_tables.table.dtype == np.int32
    if runner.static_decode is not None:
        assert runner.static_decode.inputs.block_table.dtype == torch.int32
        assert all(t.dtype == torch.int32 for md in runner.static_decode.metadata.values()
                   for _, t in block_table_tensors(md))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_every_backend_builds_int32_block_tables_from_a_step(monkeypatch, backend, block_size):
    """The metadata alone (no kernel runs), so backends whose kernels are slow on CPU are covered too."""
    flash_reference(monkeypatch)
    try:
        attn = get_attn_backend(backend, torch.device("cpu"), torch.bfloat16)
    except ValueError as e:
        pytest.skip(str(e))
    greedy = SamplingParams(temperature=0.0)
    step = SchedulerOutput([
        ScheduledRequest("decode", [5], 2 * block_size + 3, [3, 4, 5], True, greedy, [1, 2]),
        ScheduledRequest("fresh", list(range(1, 10)), 0, [6], True, greedy),
        ScheduledRequest("prefix-hit", [7, 8, 9], block_size, [1, 2], True, greedy),
    ], 13)
    common = InputBatch(4, 8, block_size, torch.device("cpu")).prepare(step).common
    tables = list(block_table_tensors(common, "common")) + list(block_table_tensors(attn.build(common), "backend"))
    assert any(p.startswith("common") for p, _ in tables)  # a backend may keep none of its own (flash unpaged)
    assert [p for p, t in tables if t.dtype != torch.int32] == []


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("backend", ["torch", "flash_attn"])  # triton's kernels crawl through the interpreter
def test_block_tables_are_int32_end_to_end_on_cpu(monkeypatch, stories_path, backend, block_size):
    flash_reference(monkeypatch)  # the reference, like flash-attn, raises on a table that is not int32
    engine = LLMEngine(config(stories_path, attention_backend=backend, block_size=block_size, dtype="float32",
                              device="cpu", max_num_batched_tokens=64), skip_tokenizer_init=True)
    check_int32(engine)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_block_tables_are_int32_end_to_end_on_cuda(stories_path, backend, block_size, cuda_graphs):
    dtype = cuda_dtype_or_skip(backend, block_size, cuda_graphs)
    engine = LLMEngine(config(stories_path, attention_backend=backend, block_size=block_size, dtype=dtype,
                              device="cuda", cuda_graphs=cuda_graphs, max_num_batched_tokens=64),
                       skip_tokenizer_init=True)
    check_int32(engine)
