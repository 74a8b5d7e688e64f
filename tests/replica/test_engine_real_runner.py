"""With the real model runner and KV cache manager (stories260K): the tokens do not depend on cache hits,
chunking, preemption or batching, and 64 requests on a too-small pool all finish by preemption."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")

from kvmesh.replica.llm import LLM  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402


def make_llm(path, **kw) -> LLM:
    kw.setdefault("kv_cache_memory", 1 << 22)
    return LLM(str(path), dtype="float32", debug_check_integrity=True, **kw)


def story_prompts(llm: LLM, n: int, seed: int) -> list[list[int]]:
    """Prompts of mixed lengths that share prefixes (so later ones hit the cache)."""
    tok = llm.get_tokenizer()
    base = tok("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
               "park with her friends. One day, she saw a big red ball under a tree.").input_ids
    rng = random.Random(seed)
    return [base[: rng.randrange(4, len(base))] + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 60))]
            for _ in range(n)]


def run(llm: LLM, prompts, lengths):
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    return [o.output_token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def test_cache_chunks_preemption_and_batching_do_not_change_tokens(stories_path):
    plain = make_llm(stories_path, enable_prefix_caching=False, max_num_seqs=1, max_num_batched_tokens=512)
    prompts = story_prompts(plain, 6, seed=0)
    lengths = [12] * len(prompts)
    expected = run(plain, prompts, lengths)  # one at a time, unchunked, no cache
    squeezed = make_llm(stories_path, num_kv_blocks=14, block_size=8, max_num_batched_tokens=24)
    got = run(squeezed, prompts, lengths)  # batched, chunked, cached, preempted
    engine = squeezed.llm_engine
    assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0
    assert got == expected
    again = run(squeezed, prompts, lengths)  # now mostly from the prefix cache
    assert again == expected


def test_64_concurrent_requests_finish_on_a_small_pool(stories_path):
    llm = make_llm(stories_path, num_kv_blocks=40, block_size=16, max_num_batched_tokens=256)
    prompts = story_prompts(llm, 64, seed=1)
    rng = random.Random(2)
    lengths = [rng.randrange(1, 40) for _ in prompts]
    got = run(llm, prompts, lengths)  # check_integrity() after every step (debug_check_integrity)
    engine = llm.llm_engine
    assert engine.stats.num_preemptions > 0
    assert [len(g) for g in got] == lengths
    assert engine.kv_cache_manager.usage == 0.0
    roomy = make_llm(stories_path, enable_prefix_caching=False, max_num_batched_tokens=4096)
    assert run(roomy, prompts, lengths) == got
