"""The real flash_attn backend on CPU, with the plain-torch flash-attn reference injected as ``flash_attn``.

Every call the backend makes goes through the reference's copy of the kernel's checks (dtypes, int32
metadata, page-size rule, shapes), so a calling mistake fails here before it reaches a GPU. Tokens
must equal the torch backend's through prefix hits, chunked prefill, preemption and mixed batches,
for every block size: multiples of 256 take the paged path (flash_attn_with_kvcache for decodes,
varlen with block_table for prefills), the others the gathered-keys path.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch
from kvmesh.replica.attention import flash_attn_reference
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.attention.flash_attn_backend import PAGED_BLOCK_MULTIPLE
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams

from .attention_steps import make_step

CPU = torch.device("cpu")
GQA_MODEL = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, vocab_size=300, max_position_embeddings=1024,
                 initializer_range=0.2)


def probe_transformers_first() -> None:
    """transformers looks for flash_attn when first imported and cannot read a stand-in's package
    metadata: let it find the real (absent) package before the stand-in goes in."""
    import transformers.integrations.flash_attention  # noqa: F401
    from transformers import AutoConfig  # noqa: F401


@pytest.fixture
def flash_reference(monkeypatch):
    """flash_attn = the reference (float32 allowed so tokens can match the torch backend bit for bit)."""
    probe_transformers_first()
    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module(allow_float32=True))


@pytest.fixture
def strict_flash_reference(monkeypatch):
    """flash_attn = the reference with the kernel's own dtype rule (fp16/bf16 only)."""
    probe_transformers_first()
    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module())


# -- one step through the backend ------------------------------------------------------------------


def torch_layout(cache: torch.Tensor) -> torch.Tensor:
    return cache.permute(0, 3, 1, 2, 4).contiguous()  # [2, Hk, num_blocks, block_size, Dh]


@pytest.mark.parametrize("block_size", [1, 4, 16, 256, 512])
def test_flash_backend_step_equals_torch_backend_step(flash_reference, block_size):
    # decodes (one crossing into a new block), a fresh prefill, a chunk after a cached prefix
    specs = [(2 * block_size - 1, 1), (block_size + 3, 1), (0, 1), (0, 9), (block_size, 6)]
    q, k, v, cache, common = make_step(specs, block_size, num_blocks=12 + 24 // block_size)
    flash, ref = get_attn_backend("flash_attn", CPU, torch.float32), get_attn_backend("torch", CPU, torch.float32)
    flash_cache, torch_cache = cache.clone(), torch_layout(cache)
    got = flash.forward(q, k, v, flash_cache, flash.build(common), 0.3)
    expected = ref.forward(q, k, v, torch_cache, ref.build(common), 0.3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch_layout(flash_cache), torch_cache)  # same slots written
    paged = block_size % PAGED_BLOCK_MULTIPLE == 0
    md = flash.build(common)
    assert (md.block_table is not None) == paged and (md.key_slots is None) == paged


def test_an_int64_block_table_is_caught_like_the_kernel_would(strict_flash_reference):
    """The deliberate deviation: a runner that hands flash-attn int64 block tables fails on CPU too."""
    q, k, v, cache, common = make_step([(300, 1), (0, 4)], 256, num_blocks=6)
    q, k, v, cache = (x.bfloat16() for x in (q, k, v, cache))
    flash = get_attn_backend("flash_attn", CPU, torch.bfloat16)
    flash.forward(q, k, v, cache, flash.build(common), 0.3)  # the backend's own call is accepted
    common.block_tables = common.block_tables.long()
    with pytest.raises(RuntimeError, match="block_table must have dtype torch.int32"):
        flash.forward(q, k, v, cache, flash.build(common), 0.3)


def test_float32_is_refused_up_front_like_the_kernel_refuses_it(strict_flash_reference):
    with pytest.raises(ValueError, match="not float32"):
        get_attn_backend("flash_attn", CPU, torch.float32)
    assert get_attn_backend(None, CPU, torch.bfloat16).name == "torch"  # auto never picks flash on CPU


# -- whole engines: same tokens as the torch backend ----------------------------------------------


def run(config: EngineConfig, prompts: dict[str, list[int]], max_tokens: int) -> tuple[dict, LLMEngine]:
    engine = LLMEngine(config, skip_tokenizer_init=True)
    execute, engine.partial_chunks = engine.model_runner.execute_model, 0

    def counting(out):  # prefill chunks that stop short of the prompt's end (chunked prefill)
        engine.partial_chunks += sum(not sr.sample for sr in out.scheduled)
        return execute(out)

    engine.model_runner.execute_model = counting
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    finals = {}
    for rid, prompt in prompts.items():  # two waves, so the second finds the first's blocks cached
        engine.add_request(EngineRequest(rid, prompt, params))
        if rid.endswith("-hit"):
            while engine.has_unfinished_requests():
                for out in engine.step():
                    finals[out.request_id] = out.output_token_ids
    while engine.has_unfinished_requests():
        for out in engine.step():
            finals[out.request_id] = out.output_token_ids
    return finals, engine


def workload(block_size: int, vocab: int, seed: int = 0) -> dict[str, list[int]]:
    """A shared prefix of whole blocks (prefix hits) and prompts of uneven lengths (mixed batches);
    the even-numbered prompts end just short of a block boundary, so decoding needs a new block."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range((1 if block_size >= 256 else 2) * block_size + 1)]
    prompts = {"first-hit": shared + [5, 6, 7]}
    for i in range(5):
        if i % 2:
            prompts[f"r{i}"] = shared + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 20))]
        else:
            n = block_size - 1 - i % block_size if block_size > 8 else rng.randrange(5, 60)
            prompts[f"r{i}"] = [rng.randrange(3, vocab) for _ in range(n)]
    return prompts


def compare_backends(base: dict, block_size: int, vocab: int, max_tokens: int = 12):
    prompts = workload(block_size, vocab)
    longest = max(map(len, prompts.values())) + max_tokens
    blocks_per_request = -(-longest // block_size)
    kw = dict(base, block_size=block_size, dtype="float32", device="cpu", hash_seed=b"s", kv_cache_memory=1 << 26,
              max_num_batched_tokens=max(block_size, 24),  # long prompts are chunked
              num_kv_blocks=blocks_per_request + 2)  # too few for all at once: preemption
    outs, engines = {}, {}
    for backend in ("torch", "flash_attn"):
        outs[backend], engines[backend] = run(EngineConfig(attention_backend=backend, **kw), prompts, max_tokens)
    stats = engines["flash_attn"].stats
    assert stats.prefix_cache_hits > 0 and stats.num_preemptions > 0 and engines["flash_attn"].partial_chunks > 0
    assert engines["flash_attn"].model_runner.attn_backend.name == "flash_attn"
    assert outs["flash_attn"] == outs["torch"]
    assert sorted(outs["torch"]) == sorted(prompts) and all(len(t) == max_tokens for t in outs["torch"].values())


@pytest.mark.parametrize("block_size", [16, 256])
def test_stories260k_tokens_match_the_torch_backend(flash_reference, stories_path, block_size):
    compare_backends(dict(model=str(stories_path)), block_size, vocab=512)


@pytest.mark.parametrize("block_size", [1, 8, 256, 512])
def test_gqa_model_tokens_match_the_torch_backend(flash_reference, block_size):
    compare_backends(dict(model="gqa", load_format="dummy", hf_config=GQA_MODEL), block_size, vocab=300)


@pytest.mark.parametrize("block_size", [16, 256])
def test_bfloat16_engine_passes_every_kernel_check(strict_flash_reference, stories_path, block_size):
    """The dtype real GPUs run: with the kernel's own dtype rule, every call of a whole workload
    (prefix hits, chunks, preemption) is accepted, and tokens stay close to the torch backend's."""
    prompts = workload(block_size, 512)
    longest = max(map(len, prompts.values())) + 8
    kw = dict(model=str(stories_path), block_size=block_size, dtype="bfloat16", device="cpu", hash_seed=b"s",
              kv_cache_memory=1 << 26, max_num_batched_tokens=max(block_size, 24),
              num_kv_blocks=-(-longest // block_size) + 2)
    outs = {b: run(EngineConfig(attention_backend=b, **kw), prompts, 8)[0] for b in ("flash_attn", "torch")}
    assert sorted(outs["flash_attn"]) == sorted(prompts)
    # bf16 rounding differs between the backends' kernels and greedy paths part after a near tie, so
    # only the first tokens are compared (broken attention would match ~1 in 512 of them)
    same = sum(outs["flash_attn"][rid][0] == outs["torch"][rid][0] for rid in prompts)
    assert same >= len(prompts) // 2
