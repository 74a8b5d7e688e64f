"""The engine's tokens do not depend on how the work was split: cache hits, chunks, preemption, batching.

Uses the fake runner, which samples from the context it reads back through the block table, so any
wrong block id, stale cache hit or misplaced chunk changes the output.
"""

from __future__ import annotations

import random

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner


def make_engine(num_blocks=256, block_size=4, **kw) -> LLMEngine:
    runner = FakeModelRunner(num_kv_blocks=num_blocks, block_size=block_size, max_model_len=1024)
    kw.setdefault("debug_check_integrity", True)
    config = EngineConfig(model="fake", block_size=block_size, hash_seed=b"seed", **kw)
    return LLMEngine(config, model_runner=runner, skip_tokenizer_init=True)


def run_all(engine: LLMEngine, prompts: dict[str, list[int]], max_tokens: int | dict[str, int]) -> dict:
    for rid, prompt in prompts.items():
        n = max_tokens[rid] if isinstance(max_tokens, dict) else max_tokens
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=n)))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                assert out.finish_reason == "length", out
                finals[out.request_id] = out.output_token_ids
    return finals


def reference(engine: LLMEngine, prompt: list[int], n: int) -> list[int]:
    return engine.model_runner.reference_generate(prompt, n)


def test_cached_prefix_gives_the_same_tokens_as_computing_it():
    engine = make_engine()
    shared = list(range(1, 41))
    first = run_all(engine, {"a": shared + [7, 8]}, 8)["a"]
    second = run_all(engine, {"b": shared + [7, 8]}, 8)["b"]
    assert engine.stats.prefix_cache_hits >= 40
    assert first == second == reference(engine, shared + [7, 8], 8)


def test_chunked_prefill_matches_unchunked():
    prompt = [random.Random(0).randrange(1, 1000) for _ in range(100)]
    chunked = run_all(make_engine(max_num_batched_tokens=7), {"x": prompt}, 10)["x"]
    whole = run_all(make_engine(max_num_batched_tokens=2048), {"x": prompt}, 10)["x"]
    assert chunked == whole == reference(make_engine(), prompt, 10)


def test_forced_preemption_and_recompute_give_the_same_tokens():
    rng = random.Random(1)
    prompts = {f"r{i}": [rng.randrange(1, 1000) for _ in range(rng.randrange(5, 30))] for i in range(6)}
    engine = make_engine(num_blocks=20)  # 19 usable blocks of 4 tokens for 6 requests of up to 29+24
    outs = run_all(engine, prompts, 24)
    assert engine.stats.num_preemptions > 0
    for rid, prompt in prompts.items():
        assert outs[rid] == reference(engine, prompt, 24), rid


def test_batched_equals_one_at_a_time():
    rng = random.Random(2)
    prompts = {f"r{i}": [rng.randrange(1, 1000) for _ in range(rng.randrange(3, 50))] for i in range(8)}
    batched = run_all(make_engine(max_num_batched_tokens=64), prompts, 12)
    single = {}
    for rid, p in prompts.items():
        single.update(run_all(make_engine(enable_prefix_caching=False), {rid: p}, 12))
    assert batched == single


@pytest.mark.parametrize("caching", [True, False])
def test_64_mixed_requests_on_a_small_pool_finish_by_preemption(caching):
    rng = random.Random(3)
    shared = [rng.randrange(1, 1000) for _ in range(32)]
    prompts, lengths = {}, {}
    for i in range(64):
        own = [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 120))]
        prompts[f"r{i}"] = (shared if i % 2 else []) + own
        lengths[f"r{i}"] = rng.randrange(1, 40)
    engine = make_engine(num_blocks=60, max_num_batched_tokens=128, enable_prefix_caching=caching)
    outs = run_all(engine, prompts, lengths)  # check_integrity() runs after every step
    assert engine.stats.num_preemptions > 0
    for rid, prompt in prompts.items():
        assert outs[rid] == reference(engine, prompt, lengths[rid]), rid
    assert engine.kv_cache_manager.usage == 0.0


def test_abort_frees_the_requests_blocks():
    engine = make_engine(num_blocks=64)
    free_before = engine.kv_cache_manager.block_pool.get_num_free_blocks()
    engine.add_request(EngineRequest("a", list(range(1, 30)), SamplingParams(max_tokens=50)))
    engine.add_request(EngineRequest("b", list(range(40, 50)), SamplingParams(max_tokens=50)))
    engine.step()
    engine.step()
    assert engine.kv_cache_manager.usage > 0
    engine.abort_request("a")
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "a"]
    assert aborted and aborted[0].finished and aborted[0].finish_reason == "abort"
    engine.abort_request("b")
    engine.step()
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache_manager.usage == 0.0
    assert engine.kv_cache_manager.block_pool.get_num_free_blocks() == free_before


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_tiny_token_budgets_split_prefills_into_single_tokens(budget):
    prompts = {"a": list(range(1, 12)), "b": list(range(50, 61)), "c": [7, 8, 9]}
    outs = run_all(make_engine(max_num_batched_tokens=budget), prompts, 6)
    for rid, prompt in prompts.items():
        assert outs[rid] == reference(make_engine(), prompt, 6), rid
