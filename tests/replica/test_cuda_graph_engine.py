"""Decode steps run on static shapes (replayed from CUDA graphs on a GPU) give the eager engine's tokens
while requests are preempted and while prompts arrive in chunks between decode steps.

On a GPU (``gpu``): every attention backend and block size with a static decode path, graphs captured
and replayed. The CPU twins run the same engines and checks with the padded static forward executed
eagerly through the flash-attn reference (the capture is the only part they leave out)."""

from __future__ import annotations

import pytest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode

from .engine_paths import (
    BLOCK_SIZES,
    CUDA_BACKENDS,
    config,
    cuda_dtype_or_skip,
    flash_reference,
    free_cuda_memory,
    pool_that_preempts,
    run,
    waves,
)

STATIC_BLOCK = 256  # the block size the flash backend's static decode path needs (its CPU twin runs there)


def preempting(stories_path, block_size: int, **kw):
    prompts, lengths = waves(block_size)
    kw = dict(kw, block_size=block_size, num_kv_blocks=pool_that_preempts(block_size, prompts, lengths))
    return prompts, lengths, kw


def chunking(stories_path, block_size: int, **kw):
    prompts, lengths = waves(block_size, seed=1)
    return prompts, lengths, dict(kw, block_size=block_size, max_num_batched_tokens=48)


SCENARIOS = {"preemption": preempting, "chunked_prefill": chunking}


def check(eager, static) -> None:
    assert static.tokens == eager.tokens
    assert len(eager.tokens) == 5 and static.static_steps > 0


def check_scenario(name: str, eager, static) -> None:
    check(eager, static)
    if name == "preemption":
        assert eager.num_preemptions > 0 and static.num_preemptions > 0
    else:
        assert eager.partial_chunks > 0 and static.partial_chunks > 0


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_static_decode_gives_the_eager_tokens_on_cpu(monkeypatch, stories_path, scenario):
    flash_reference(monkeypatch)
    prompts, lengths, kw = SCENARIOS[scenario](stories_path, STATIC_BLOCK, attention_backend="flash_attn",
                                               dtype="float32", device="cpu")
    eager = run(LLMEngine(config(stories_path, **kw), skip_tokenizer_init=True), prompts, lengths)
    engine = LLMEngine(config(stories_path, **kw), skip_tokenizer_init=True)
    runner = engine.model_runner
    runner.static_decode = StaticDecode(runner.model, runner.attn_backend, 8,
                                        runner.input_batch.block_tables.table.shape[1], STATIC_BLOCK, runner.device)
    check_scenario(scenario, eager, run(engine, prompts, lengths))


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_cuda_graph_replay_gives_the_eager_tokens(stories_path, scenario, backend, block_size):
    dtype = cuda_dtype_or_skip(backend, block_size, cuda_graphs=True)
    prompts, lengths, kw = SCENARIOS[scenario](stories_path, block_size, attention_backend=backend, dtype=dtype,
                                               device="cuda")
    runs = {}
    for graphs in (False, True):
        engine = LLMEngine(config(stories_path, cuda_graphs=graphs, **kw), skip_tokenizer_init=True)
        assert (engine.model_runner.static_decode is not None) == graphs
        runs[graphs] = run(engine, prompts, lengths)
        del engine
        free_cuda_memory()
    check_scenario(scenario, runs[False], runs[True])
    assert runs[True].replays == runs[True].static_steps  # every static step replayed a captured graph
