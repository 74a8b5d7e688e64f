"""Decode steps on static, padded shapes (the CUDA-graph path), run eagerly on CPU through the
flash-attn reference and through the triton kernel (Triton's interpreter); the capture itself needs
CUDA (``gpu`` marker). Which backend and whether graphs are used by default is decided here too."""

from __future__ import annotations

import random
import sys

import pytest
import torch
from kvmesh.replica.attention import flash_attn_reference
from kvmesh.replica.attention.backend import default_backend, get_attn_backend
from kvmesh.replica.attention.flash_attn_backend import FlashAttentionBackend
from kvmesh.replica.attention.torch_backend import TorchAttentionBackend
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.triton_utils import triton_problem
from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode, use_cuda_graphs
from torch.utils._python_dispatch import TorchDispatchMode

BLOCK = 256
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # device objects only: nothing runs on CUDA here
needs_triton = pytest.mark.skipif(triton_problem(CUDA) is not None, reason=str(triton_problem(CUDA)))


@pytest.fixture
def flash_reference(monkeypatch):
    import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)

    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module(allow_float32=True))


def generate(engine: LLMEngine, prompts: dict[str, list[int]], lengths: dict[str, int]) -> dict[str, list[int]]:
    for rid, prompt in prompts.items():
        engine.add_request(EngineRequest(rid, prompt,
                                         SamplingParams(temperature=0.0, max_tokens=lengths[rid], ignore_eos=True)))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.output_token_ids
    return finals


def count_sizes(static: StaticDecode) -> list[tuple[int, int]]:
    """Record (rows, capture size) of every decode step the static path runs."""
    sizes, run = [], static.run
    static.run = lambda n, sampling=None: sizes.append((n, static.size_for(n))) or run(n, sampling)
    return sizes


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
    sizes = count_sizes(static)
    assert generate(engine, prompts, lengths) == eager
    assert {(7, 8), (5, 8), (3, 4), (1, 1)} <= set(sizes)  # padded to capture sizes as requests finished


class Writes(TorchDispatchMode):
    """Counts copies and fills into one buffer (``storage``: the graphs' inputs)."""

    def __init__(self, storage: torch.Tensor) -> None:
        super().__init__()
        self.ptr, self.count = storage.untyped_storage().data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket in (torch.ops.aten.copy_, torch.ops.aten.fill_, torch.ops.aten.zero_) and \
            args[0].untyped_storage().data_ptr() == self.ptr
        return func(*args, **(kwargs or {}))


def test_a_static_step_runs_on_the_inputs_it_staged_with_no_copy_or_fill(flash_reference, stories_path):
    """The step's upload lands in the graphs' inputs, padding rows included: the run itself copies and fills
    nothing, whether the batch is steady or shrinks (rows a bigger step left are rewritten by the upload)."""
    config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", attention_backend="flash_attn",
                          block_size=BLOCK, max_num_seqs=8, kv_cache_memory=1 << 24, hash_seed=b"s")
    engine = LLMEngine(config, skip_tokenizer_init=True)
    runner = engine.model_runner
    runner.static_decode = static = StaticDecode(runner.model, runner.attn_backend, 8,
                                                 runner.input_batch.block_tables.table.shape[1], BLOCK, runner.device)
    writes, run = [], static.run

    def counted(n, sampling=None):
        with Writes(static.inputs.buffer.gpu) as mode:
            out = run(n, sampling)
        inputs = static.inputs
        padding = [inputs.input_ids[n:4].tolist(), inputs.seq_lens[n:4].tolist(), inputs.block_table[n:4].sum().item()]
        writes.append((n, mode.count, padding))
        return out

    static.run = counted
    generate(engine, {f"r{i}": [5 + i] * 9 for i in range(4)}, {"r0": 3, "r1": 6, "r2": 6, "r3": 6})
    assert [(n, count) for n, count, _ in writes] == [(4, 0), (4, 0), (3, 0), (3, 0), (3, 0)], writes
    assert all(pad == [[0] * (4 - n), [1] * (4 - n), 0] for n, _, pad in writes)  # row 3 padding again


@pytest.mark.skipif(triton_problem(CPU) is not None, reason=f"{triton_problem(CPU)} (the gpu tests cover triton)")
def test_padded_static_decode_on_the_triton_backend_at_block_16_gives_the_torch_backends_tokens(stories_path):
    rng = random.Random(3)
    prompts = {f"r{i}": [rng.randrange(3, 512) for _ in range(rng.randrange(5, 40))] for i in range(3)}
    lengths = {rid: 2 + 2 * i for i, rid in enumerate(prompts)}  # 3 rows, then 2, then 1
    kw = dict(model=str(stories_path), dtype="float32", device="cpu", block_size=16, max_num_seqs=4,
              kv_cache_memory=1 << 20, hash_seed=b"s")
    expected = generate(LLMEngine(EngineConfig(attention_backend="torch", **kw), skip_tokenizer_init=True), prompts,
                        lengths)
    engine = LLMEngine(EngineConfig(attention_backend="triton", **kw), skip_tokenizer_init=True)
    runner = engine.model_runner
    runner.static_decode = static = StaticDecode(runner.model, runner.attn_backend, 4,
                                                 runner.input_batch.block_tables.table.shape[1], 16, runner.device)
    sizes = count_sizes(static)
    assert generate(engine, prompts, lengths) == expected
    assert {(3, 4), (2, 2), (1, 1)} <= set(sizes)


@needs_triton
def test_default_backend_is_triton_on_cuda_and_flash_attn_where_its_paged_path_runs(monkeypatch):
    assert default_backend(CPU, torch.float32, 16) == "torch"
    assert default_backend(CUDA, torch.bfloat16, 16) == "triton"
    assert default_backend(CUDA, torch.bfloat16, 256) == "triton"  # flash-attn not installed
    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module())
    assert default_backend(CUDA, torch.bfloat16, 256) == "flash_attn"
    assert default_backend(CUDA, torch.bfloat16, 16) == "triton"  # flash-attn would gather keys every step
    monkeypatch.setattr("kvmesh.replica.attention.backend.triton_problem", lambda device: "no triton")
    assert default_backend(CUDA, torch.bfloat16, 16) == "flash_attn"
    with pytest.raises(ValueError, match="attention_backend='triton' cannot run here: no triton"):
        get_attn_backend("triton", CUDA, torch.bfloat16)


@needs_triton
def test_cuda_graphs_default_to_on_where_a_static_decode_path_exists():
    triton_backend = get_attn_backend("triton", CUDA, torch.bfloat16)
    assert use_cuda_graphs(None, CUDA, triton_backend, 16) and use_cuda_graphs(None, CUDA, triton_backend, 48)
    assert not use_cuda_graphs(None, CPU, triton_backend, 16)
    assert not use_cuda_graphs(None, CUDA, TorchAttentionBackend(), 16)
    assert not use_cuda_graphs(None, CUDA, FlashAttentionBackend, 16)
    assert use_cuda_graphs(None, CUDA, FlashAttentionBackend, 256)
    assert not use_cuda_graphs(False, CUDA, triton_backend, 16)
    assert not use_cuda_graphs(None, CUDA, triton_backend, 16, tp_size=2)  # NCCL inside a capture: only on request
    assert use_cuda_graphs(True, CUDA, triton_backend, 16, tp_size=2)


def test_cuda_graphs_true_that_cannot_work_is_a_clear_error():
    with pytest.raises(ValueError, match="needs device='cuda'"):
        use_cuda_graphs(True, CPU, TorchAttentionBackend(), 16)
    with pytest.raises(ValueError, match="'torch' has no static decode path at block_size=16.*'triton'"):
        use_cuda_graphs(True, CUDA, TorchAttentionBackend(), 16)


def test_static_decode_needs_a_paged_flash_backend(flash_reference, stories_path):
    from kvmesh.replica.worker.model_runner import ModelRunner

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


def static_engine(config: EngineConfig) -> tuple[LLMEngine, list]:
    """An engine on the static decode path (run eagerly on CPU) that records the rows of each sampler call."""
    engine = LLMEngine(config, skip_tokenizer_init=True)
    runner = engine.model_runner
    runner.static_decode = StaticDecode(runner.model, runner.attn_backend, config.max_num_seqs,
                                        runner.input_batch.block_tables.table.shape[1], BLOCK, runner.device)
    sampler_rows, sample = [], runner.sampler.__call__
    runner.sampler = type("Recording", (type(runner.sampler),), {
        "__call__": lambda self, logits, md: sampler_rows.append(logits.shape[0]) or sample(logits, md)})(
        runner.sampler.logprobs_copies)
    return engine, sampler_rows


def outputs(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict:
    for rid, (prompt, params) in requests.items():
        engine.add_request(EngineRequest(rid, prompt, params))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = (out.output_token_ids, out.logprobs)
    return finals


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_greedy_decode_step_takes_the_graphs_argmax_and_no_sampler(flash_reference, stories_path,
                                                                     async_scheduling):
    config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", attention_backend="flash_attn",
                          block_size=BLOCK, max_num_seqs=4, kv_cache_memory=1 << 24, hash_seed=b"s",
                          async_scheduling=async_scheduling)
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    requests = {f"r{i}": ([5 + i, 40, 77, 300 - i], greedy) for i in range(3)}
    eager = outputs(LLMEngine(config, skip_tokenizer_init=True), requests)
    engine, sampler_rows = static_engine(config)
    assert outputs(engine, requests) == eager
    assert sampler_rows == [3]  # only the prefill step samples eagerly; 5 decode steps took the graph's argmax


def test_static_decode_samples_every_option_from_the_graphs_logits(flash_reference, stories_path):
    """Seeded, top-k/top-p, logit_bias, min_tokens and logprobs rows next to greedy ones: the sampler runs on the
    logits the graph computed and gives the eager engine's tokens and logprobs."""
    from .fake_device_runs import PROMPT, SAMPLING

    config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", attention_backend="flash_attn",
                          block_size=BLOCK, max_num_seqs=8, kv_cache_memory=1 << 24, hash_seed=b"s")
    requests = {name: (PROMPT[: 5 + i], SamplingParams(**p)) for i, (name, p) in enumerate(SAMPLING.items())}
    requests["logprobs"] = (PROMPT, SamplingParams(temperature=0.0, logprobs=3, max_tokens=6))
    eager = outputs(LLMEngine(config, skip_tokenizer_init=True), requests)
    engine, sampler_rows = static_engine(config)
    assert outputs(engine, requests) == eager
    assert len(sampler_rows) >= 6  # every decode step sampled (from the graph's logits)
    assert all(len(tokens) == 6 for tokens, _ in eager.values())


MIXED = [dict(temperature=0.9), dict(temperature=0.8, seed=1), dict(temperature=1.2, top_k=5),
         dict(temperature=0.9, top_p=0.8, seed=3), dict(temperature=1.1, top_k=40, top_p=0.9), dict(temperature=0.0)]
NO_TRUNCATION = [dict(temperature=0.9), dict(temperature=0.7, seed=2), dict(temperature=0.0), dict(temperature=1.3)]
LOGPROBS = [dict(temperature=0.9, logprobs=3), dict(temperature=0.8, top_p=0.9, seed=1),
            dict(temperature=0.0, logprobs=0),
            dict(temperature=1.2, top_k=5, logprobs=20)]


@pytest.mark.parametrize("options,variant", [(MIXED, "top_k_top_p"), (NO_TRUNCATION, "random"), (LOGPROBS, "logprobs")])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_sampled_decode_step_takes_the_graphs_draw_and_no_sampler(flash_reference, stories_path, async_scheduling,
                                                                    options, variant):
    """Temperature, seeded and unseeded, top-k, top-p and greedy rows in one batch: every decode step's tokens are
    the graph's own draw (the eager sampler runs only for the prefill), equal to the eager engine's tokens --
    unseeded rows too, since both draw from the runner's counter of unseeded draws (sample/draws.py). A batch
    without top-k/top-p rows replays the graph without the sort; one with logprobs rows the graph that packs
    them (equal to the eager sampler's)."""
    config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", attention_backend="flash_attn",
                          block_size=BLOCK, max_num_seqs=8, kv_cache_memory=1 << 24, hash_seed=b"s", seed=5,
                          async_scheduling=async_scheduling)
    requests = {f"r{i}": ([5 + i, 40, 77, 300 - i], SamplingParams(max_tokens=8, ignore_eos=True, **option))
                for i, option in enumerate(options)}
    eager = outputs(LLMEngine(config, skip_tokenizer_init=True), requests)
    engine, sampler_rows = static_engine(config)
    static, variants = engine.model_runner.static_decode, []
    run = static.run
    static.run = lambda n, sampling=None: variants.append(sampling) or run(n, sampling)
    assert outputs(engine, requests) == eager
    assert sampler_rows == [len(options)]  # the prefill; 7 decode steps sampled inside the graph
    assert variants == [variant] * 7
    assert len({tuple(tokens) for tokens, _ in eager.values()}) == len(options)
