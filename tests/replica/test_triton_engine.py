"""Whole engines on the triton attention backend: the torch backend's and transformers' greedy tokens
on stories260K.

On CPU the kernel runs through Triton's interpreter (slow: a few tokens of a few requests on stories260K cut
to 2 layers, every layer launching the same kernels, but through a prefix hit, a chunked prefill and mixed
decode + prefill steps); the ``gpu`` tests run the compiled kernel on the whole model, eagerly and replayed
from CUDA graphs at block size 16.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch
import transformers
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.layers.custom_op import force_triton
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.triton_utils import triton_problem

ONCE_UPON_A_TIME = [1, 403, 407, 261, 378]


def generate(config: EngineConfig, prompts: dict[str, list[int]], max_tokens: int | dict[str, int],
             fused: bool = False) -> tuple[dict, LLMEngine]:
    """Greedy tokens per request (max_tokens: for all, or per request id); requests whose id ends in
    "-first" finish before the rest are added (so the rest find their blocks cached)."""
    engine = LLMEngine(config, skip_tokenizer_init=True)
    if fused:  # the Triton layers (and the rotary folded into the triton backend's cache write) on CPU too
        force_triton(engine.model_runner.model, True)
    execute, engine.partial_chunks = engine.model_runner.execute_model, 0

    def counting(out):  # prefill chunks that stop short of the prompt's end
        engine.partial_chunks += sum(not sr.sample for sr in out.scheduled)
        return execute(out)

    engine.model_runner.execute_model = counting
    finals = {}
    for rid, prompt in prompts.items():
        n = max_tokens[rid] if isinstance(max_tokens, dict) else max_tokens
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)))
        if rid.endswith("-first"):
            while engine.has_unfinished_requests():
                finals.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
    return finals, engine


def workload(seed: int = 0) -> dict[str, list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 512) for _ in range(17)]  # one whole block of 16 shared
    return {"a-first": shared + [5, 6], "b": shared + [rng.randrange(3, 512) for _ in range(4)],
            "c": [rng.randrange(3, 512) for _ in range(40)]}  # 40 tokens, budget 24: chunked


@pytest.mark.skipif(triton_problem(torch.device("cpu")) is not None,
                    reason=f"{triton_problem(torch.device('cpu'))} (the gpu tests check the compiled kernel)")
def test_stories260k_tokens_match_the_torch_backend_through_the_interpreter(two_layer_stories, caplog):
    caplog.set_level(logging.INFO, logger="kvmesh.replica.worker.model_runner")
    prompts = workload()
    kw = dict(model=str(two_layer_stories), dtype="float32", device="cpu", block_size=16, kv_cache_memory=1 << 20,
              max_num_batched_tokens=24, hash_seed=b"s")
    outs = {}
    for backend in ("torch", "triton"):
        outs[backend], engine = generate(EngineConfig(attention_backend=backend, **kw), prompts, 3)
    assert engine.model_runner.attn_backend.name == "triton" and engine.model_runner.static_decode is None
    assert engine.stats.prefix_cache_hits > 0 and engine.partial_chunks > 0
    assert sorted(outs["triton"]) == sorted(prompts) and all(len(t) == 3 for t in outs["triton"].values())
    assert outs["triton"] == outs["torch"]
    assert "attention backend triton, block_size 16, no CUDA graphs" in caplog.text  # said once at start
    hf = transformers.AutoModelForCausalLM.from_pretrained(two_layer_stories, dtype=torch.float32).eval()
    for rid, prompt in prompts.items():  # and the external reference, one request at a time
        ids = torch.tensor([prompt])
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                               pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
        assert outs["triton"][rid] == expected, rid


@pytest.mark.skipif(triton_problem(torch.device("cpu")) is not None,
                    reason=f"{triton_problem(torch.device('cpu'))} (the gpu tests check the compiled kernel)")
def test_bf16_operands_give_the_torch_backends_tokens_through_the_interpreter(two_layer_stories):
    """bf16 Q/K and probabilities rounded to bf16 for P @ V (fp32 sums), the fused layers and the rotary
    embedding folded into the cache write (the CUDA path): a story prompt, a cached prefix of it and a
    chunked prefill, greedy, against the torch backend in bf16 (plain torch layers)."""
    story = ONCE_UPON_A_TIME + [264, 383, 270, 449, 262, 312, 289, 398, 284, 425, 264, 383]  # 17 tokens
    prompts = {"story-first": story, "again": story + [270], "long": story * 3}  # long: chunked (budget 24)
    kw = dict(model=str(two_layer_stories), dtype="bfloat16", device="cpu", block_size=16, kv_cache_memory=1 << 20,
              max_num_batched_tokens=24, hash_seed=b"s")
    expected, _ = generate(EngineConfig(attention_backend="torch", **kw), prompts, 6)
    got, engine = generate(EngineConfig(attention_backend="triton", **kw), prompts, 6, fused=True)
    assert engine.partial_chunks > 0 and engine.get_stats().prefix_cache_hits > 0
    assert got == expected


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_triton_backend_gives_the_torch_backends_tokens(stories_path, dtype):
    # float32: the random-token workload (prefix hit, chunks); bfloat16: a real story prompt, where the
    # model is sure of its next tokens (random tokens leave near ties that bf16 rounding may break)
    prompts = workload(1) if dtype == "float32" else {"story": ONCE_UPON_A_TIME}
    kw = dict(model=str(stories_path), dtype=dtype, device="cuda", block_size=16, gpu_memory_utilization=0.05,
              max_num_batched_tokens=24, hash_seed=b"s", cuda_graphs=False)
    outs = {}
    for backend in ("torch", "triton"):
        outs[backend], engine = generate(EngineConfig(attention_backend=backend, **kw), prompts, 12)
        del engine
        torch.cuda.empty_cache()
    assert outs["triton"] == outs["torch"]


@pytest.mark.gpu
def test_cuda_graph_replay_gives_the_eager_tokens_at_block_16(stories_path):
    rng = random.Random(2)
    prompts = {f"r{i}": [rng.randrange(3, 512) for _ in range(rng.randrange(5, 300))] for i in range(5)}
    lengths = {rid: 4 + 3 * i for i, rid in enumerate(prompts)}  # requests end one by one: 5, 4, ... 1 rows
    outs = {}
    for graphs in (False, None):  # None: the default, on for triton on CUDA
        # float32: padded batches run other GEMM shapes, whose bf16 rounding could break a near tie
        config = EngineConfig(model=str(stories_path), dtype="float32", device="cuda", block_size=16,
                              max_num_seqs=8, gpu_memory_utilization=0.05, cuda_graphs=graphs, hash_seed=b"s")
        outs[graphs], engine = generate(config, prompts, lengths)
        runner = engine.model_runner
        assert runner.attn_backend.name == "triton"
        assert (runner.static_decode is not None and bool(runner.static_decode.graphs)) == (graphs is None)
        del engine, runner
        torch.cuda.empty_cache()
    assert outs[None] == outs[False]


@pytest.mark.skipif(triton_problem(torch.device("cpu")) is not None,
                    reason=f"{triton_problem(torch.device('cpu'))} (the gpu tests check the compiled kernel)")
def test_decode_steps_folded_into_one_attention_launch_give_the_torch_backends_tokens_under_preemption(
        monkeypatch, two_layer_stories):
    """The GPU's decode path on CPU: rotary, the K/V write and the split-KV merge inside the attention launch
    (split-KV sized for a 32-SM GPU: 2 or 4 parts at these batches; the kernel tests split long contexts
    many ways), decode steps padded to static sizes, requests preempted and recomputed -- the torch
    backend's tokens."""
    from kvmesh.replica.attention import triton_paged_attention as tpa
    from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode

    from .engine_paths import config, pool_that_preempts, run

    rng = random.Random(3)  # one-block prompts a few tokens under its end, in a pool of 4 blocks: each
    prompts = [{f"r{i}": [rng.randrange(3, 512) for _ in range(n)] for i, n in enumerate((13, 12, 14))}]
    lengths = {"r0": 6, "r1": 6, "r2": 5}  # needs a second block a few decode steps in, and preempts for it
    kw = dict(block_size=16, dtype="float32", device="cpu", num_kv_blocks=pool_that_preempts(16, prompts, lengths))
    expected = run(LLMEngine(config(two_layer_stories, attention_backend="torch", **kw), skip_tokenizer_init=True),
                   prompts, lengths)
    monkeypatch.setattr(tpa, "num_sms", lambda device: 32)  # few parts: every interpreted program costs ~1 ms
    engine = LLMEngine(config(two_layer_stories, attention_backend="triton", **kw), skip_tokenizer_init=True)
    force_triton(engine.model_runner.model, True)
    runner = engine.model_runner
    runner.static_decode = StaticDecode(runner.model, runner.attn_backend, 8,
                                        runner.input_batch.block_tables.table.shape[1], 16, runner.device)
    got = run(engine, prompts, lengths)
    assert got.num_preemptions > 0 and got.static_steps > 0
    assert got.tokens == expected.tokens
