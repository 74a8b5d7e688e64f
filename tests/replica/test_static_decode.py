"""Decode steps on static, padded shapes (the CUDA-graph path), run eagerly on CPU through the
flash-attn reference; the capture itself needs CUDA and a real flash-attn (``gpu`` marker)."""

from __future__ import annotations

import random
import sys

import pytest
import torch
from kvmesh.replica.attention import flash_attn_reference
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.cuda_graph import StaticDecode
from kvmesh.replica.engine import LLMEngine
from kvmesh.replica.sampling_params import SamplingParams

BLOCK = 256


@pytest.fixture
def flash_reference(monkeypatch):
    import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)

    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module(allow_float32=True))


def generate(engine: LLMEngine, prompts: dict[str, list[int]], lengths: dict[str, int]) -> dict[str, list[int]]:
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=lengths[rid], ignore_eos=True))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.output_token_ids
    return finals


def test_padded_static_decode_gives_the_eager_tokens(flash_reference, stories_path):
    rng = random.Random(0)
    prompts = {f"r{i}": [rng.randrange(3, 512) for _ in range(rng.randrange(5, 300))] for i in range(7)}
    lengths = {rid: 3 + 4 * i for i, rid in enumerate(prompts)}  # requests end one by one: 7, 6, ... 1 rows
    config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", attention_backend="flash_attn",
                          block_size=BLOCK, max_num_seqs=8, kv_cache_memory=1 << 24, hash_seed=b"s")
    eager = generate(LLMEngine(config, skip_tokenizer_init=True), prompts, lengths)

    engine = LLMEngine(config, skip_tokenizer_init=True)
    runner = engine.model_runner
    runner.static_decode = static = StaticDecode(runner.model, runner.attn_backend, 8,
                                                 runner.input_batch.block_tables.table.shape[1], BLOCK, runner.device)
    sizes = []
    run = static.run
    static.run = lambda ids, pos, common: sizes.append((common.num_reqs, static.size_for(common.num_reqs))) or run(
        ids, pos, common)
    assert generate(engine, prompts, lengths) == eager
    assert {(7, 8), (5, 8), (3, 4), (1, 1)} <= set(sizes)  # padded to capture sizes as requests finished


def test_static_decode_needs_a_paged_flash_backend(flash_reference, stories_path):
    from kvmesh.replica.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(model=str(stories_path), dtype="float32", device="cpu", block_size=16,
                                      kv_cache_memory=1 << 22, attention_backend="flash_attn"))
    with pytest.raises(ValueError, match="multiple of 256"):
        StaticDecode(runner.model, runner.attn_backend, 8, 40, 16, runner.device)
    with pytest.raises(ValueError, match="needs device='cuda'"):
        ModelRunner(EngineConfig(model=str(stories_path), dtype="float32", device="cpu", cuda_graphs=True,
                                 kv_cache_memory=1 << 22))


@pytest.mark.gpu
def test_cuda_graph_decode_gives_the_eager_tokens(stories_path):
    pytest.importorskip("flash_attn")
    rng = random.Random(1)
    prompts = {f"r{i}": [rng.randrange(3, 512) for _ in range(rng.randrange(5, 300))] for i in range(5)}
    lengths = {rid: 4 + 3 * i for i, rid in enumerate(prompts)}
    outs = {}
    for graphs in (False, True):
        config = EngineConfig(model=str(stories_path), dtype="bfloat16", device="cuda", attention_backend="flash_attn",
                              block_size=BLOCK, max_num_seqs=8, gpu_memory_utilization=0.05, cuda_graphs=graphs,
                              hash_seed=b"s")
        engine = LLMEngine(config, skip_tokenizer_init=True)
        assert (engine.model_runner.static_decode is not None) == graphs
        outs[graphs] = generate(engine, prompts, lengths)
        del engine
        torch.cuda.empty_cache()
    assert outs[True] == outs[False]
