"""Short one-request prefill steps on static, padded shapes (prefill_graph.py), run eagerly on CPU through the
Triton kernel (Triton's interpreter) and the flash-attn reference; the capture itself needs CUDA. The tokens
must be the eager path's and the torch backend's, over cached prefixes of 0, 1 and many blocks. On CPU the model
is stories260K cut to 2 layers (every layer runs the same kernels; each costs the interpreter)."""

from __future__ import annotations

import random
import sys

import pytest
import torch
from kvmesh.replica.attention import flash_attn_reference
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.triton_utils import triton_problem
from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode
from kvmesh.replica.worker.graphs.prefill_graph import PREFILL_SIZES

CPU = torch.device("cpu")
needs_triton = pytest.mark.skipif(triton_problem(CPU) is not None, reason=f"{triton_problem(CPU)}")
SUFFIXES = (1, 5, 16, 17, 64, 65)
PREFIX_BLOCKS = (0, 1, 9)


def engine(backend: str, block_size: int, static: bool, **kw) -> tuple[LLMEngine, list, list]:
    """An engine; with ``static`` its runner has the static paths (decode and prefill), recorded: (decode rows)
    and (prefill size) of every step that took them."""
    config = EngineConfig(model=kw.pop("model"), dtype="float32", device="cpu", attention_backend=backend,
                          block_size=block_size, max_num_seqs=4, kv_cache_memory=1 << 23, hash_seed=b"s", **kw)
    eng = LLMEngine(config, skip_tokenizer_init=True)
    decodes, prefills = [], []
    if static:
        runner = eng.model_runner
        runner.static_decode = sd = StaticDecode(runner.model, runner.attn_backend, 4,
                                                 runner.input_batch.block_tables.table.shape[1], block_size,
                                                 runner.device, runner.max_model_len)
        assert sd.prefill is not None and sd.prefill.sizes == PREFILL_SIZES
        run_decode, run_prefill = sd.run, sd.prefill.run
        sd.run = lambda n, sampling=None: decodes.append(n) or run_decode(n, sampling)
        sd.prefill.run = lambda size, sampling=None: prefills.append(size) or run_prefill(size, sampling)
    return eng, decodes, prefills


def one_by_one(eng: LLMEngine, prompts: list[list[int]], params: dict) -> list[list[int]]:
    """Each prompt alone (its prefill is a one-request step), in order: later ones hit earlier ones' blocks."""
    tokens = []
    for i, prompt in enumerate(prompts):
        eng.add_request(EngineRequest(f"r{i}", prompt, SamplingParams(ignore_eos=True, **params)))
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    tokens.append(out.output_token_ids)
    return tokens


def cached_prefix_prompts(block_size: int, seed: int = 0) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """For each prefix length in blocks: a prompt that fills the cache with the prefix (one step of
    ``blocks * block_size + 1`` tokens), then the prefix with each suffix (its step computes exactly the suffix).
    Returns the prompts and their (prefix blocks, suffix length) cases, fillers excluded."""
    rng = random.Random(seed)
    prompts, cases = [], []
    for blocks in PREFIX_BLOCKS:
        prefix = [rng.randrange(3, 500) for _ in range(blocks * block_size)]
        if blocks:
            prompts.append(prefix + [rng.randrange(3, 500)])
        for suffix in SUFFIXES:
            prompts.append(prefix + [rng.randrange(3, 500) for _ in range(suffix)])
            cases.append((blocks, suffix))
    return prompts, cases


@needs_triton
def test_short_prefills_on_the_triton_backend_give_the_eager_and_torch_backends_tokens(two_layer_stories):
    prompts, cases = cached_prefix_prompts(16)
    greedy = dict(temperature=0.0, max_tokens=2)  # a prefill step and one decode step each (the interpreter is slow)
    torch_tokens = one_by_one(engine("torch", 16, False, model=str(two_layer_stories))[0], prompts, greedy)
    eager_tokens = one_by_one(engine("triton", 16, False, model=str(two_layer_stories))[0], prompts, greedy)
    eng, decodes, prefills = engine("triton", 16, True, model=str(two_layer_stories))
    assert one_by_one(eng, prompts, greedy) == eager_tokens == torch_tokens
    hits = eng.get_stats().prefix_cache_hits
    assert hits > 0
    # each prompt's first step: 1 token -> the decode graph of 1 row; 2..64 tokens -> the next prefill size; more
    # (the 65-token suffix, the 9-block cache fillers) -> eager
    size = {q: next((p for p in PREFILL_SIZES if p >= q), None) for q in range(2, 200)}
    fillers = {blocks: [blocks * 16 + 1] if blocks else [] for blocks in PREFIX_BLOCKS}
    steps = [q for blocks in PREFIX_BLOCKS for q in fillers[blocks] + [s for b, s in cases if b == blocks]]
    assert prefills == [size[q] for q in steps if q > 1 and size[q]]
    assert set(prefills) == set(PREFILL_SIZES)
    assert len(decodes) == len(prompts) + steps.count(1)  # one decode step a prompt, and the 1-token steps


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_short_prefills_on_the_flash_attn_reference_give_the_eager_tokens(monkeypatch, two_layer_stories,
                                                                        async_scheduling):
    """The paged flash-attn path (block 256): a 300-token prompt, then 5 and 40 tokens over its cached block,
    and a fresh 3-token prompt; with async scheduling too (the eager reference is synchronous)."""
    import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)

    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module(allow_float32=True))
    rng = random.Random(1)
    prefix = [rng.randrange(3, 500) for _ in range(256)]
    prompts = [prefix + [7] * 44, prefix + [9, 8, 7, 6, 5], prefix + [rng.randrange(3, 500) for _ in range(40)],
               [11, 12, 13]]
    seeded = dict(temperature=0.9, top_p=0.9, seed=5, max_tokens=3)
    eager = one_by_one(engine("flash_attn", 256, False, model=str(two_layer_stories))[0], prompts, seeded)
    eng, _, prefills = engine("flash_attn", 256, True, model=str(two_layer_stories), async_scheduling=async_scheduling)
    assert one_by_one(eng, prompts, seeded) == eager
    assert prefills == [16, 64, 16]  # the 300-token prompt ran eagerly


@pytest.mark.gpu
@pytest.mark.parametrize("backend, block_size", [("triton", 16), ("flash_attn", 256)])
def test_captured_prefill_graphs_give_the_eager_tokens_and_replay(stories_path, backend, block_size):
    """On a GPU: the runner captures the prefill graphs with the decode graphs, the cached-prefix steps replay
    them, and the tokens are the eager engine's."""
    if backend == "flash_attn":
        pytest.importorskip("flash_attn")
    prompts, _ = cached_prefix_prompts(block_size, seed=2)
    greedy = dict(temperature=0.0, max_tokens=2)  # a prefill step and one decode step each (the interpreter is slow)
    outs, replays = {}, []
    for graphs in (False, True):
        config = EngineConfig(model=str(stories_path), dtype="bfloat16", device="cuda", attention_backend=backend,
                              block_size=block_size, max_num_seqs=4, gpu_memory_utilization=0.05, cuda_graphs=graphs,
                              hash_seed=b"s")
        eng = LLMEngine(config, skip_tokenizer_init=True)
        if graphs:
            prefill = eng.model_runner.static_decode.prefill
            run = prefill.run
            prefill.run = lambda size, sampling=None, prefill=prefill, run=run: \
                replays.append((size, sampling) in prefill.graphs) or run(size, sampling)
        outs[graphs] = one_by_one(eng, prompts, greedy)
        del eng
        torch.cuda.empty_cache()
    assert outs[True] == outs[False]
    assert replays and all(replays)
