"""Tensor parallelism on CPU (gloo, one Ray worker per rank): TP=2 gives TP=1's greedy tokens; a dead rank fails
fast."""

from __future__ import annotations

import time

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.model_runner import ModelRunner
from kvmesh.replica.worker.tp_executor import RayTPExecutor

pytestmark = pytest.mark.ray

GQA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
           max_position_embeddings=256, initializer_range=0.1, bos_token_id=1, eos_token_id=2)
# Two prompts share a 40-token prefix (prefix cache hit on the second), one is long enough to be chunked.
PROMPTS = [list(range(3, 43)), list(range(3, 43)) + [50, 51, 52], [7, 8, 9, 10], [5] * 70]


@pytest.fixture(scope="module")
def gqa_path(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gqa")
    LlamaForCausalLM(LlamaConfig(**GQA)).save_pretrained(path)
    return path


def engine_config(path, tp: int) -> EngineConfig:
    return EngineConfig(model=str(path), dtype="float32", device="cpu", kv_cache_memory=1 << 21,
                        tensor_parallel_size=tp, max_num_batched_tokens=48)


def greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 12,
           params: list[SamplingParams] | None = None) -> list[list[int]]:
    params = params or [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)] * len(prompts)
    outs: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), p, params[i]))
        if i == 0:  # finish the first so the second request hits its cached prefix
            while engine.has_unfinished_requests():
                outs.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
    return [outs[str(i)] for i in range(len(prompts))]


def tp1_tokens(path, params: list[SamplingParams] | None = None) -> list[list[int]]:
    config = engine_config(path, 1)
    return greedy(LLMEngine(config, model_runner=ModelRunner(config), skip_tokenizer_init=True), PROMPTS, params=params)


@pytest.fixture(scope="module")
def tp2(ray_session, stories_path):
    executor = RayTPExecutor(engine_config(stories_path, 2), step_timeout_s=30)
    yield executor
    executor.shutdown()


def test_tp2_matches_tp1_on_stories260k(tp2, stories_path):
    engine = LLMEngine(engine_config(stories_path, 2), model_runner=tp2, skip_tokenizer_init=True)
    assert greedy(engine, PROMPTS) == tp1_tokens(stories_path)
    assert engine.stats.prefix_cache_hits >= 32


def test_tp2_matches_tp1_on_random_gqa_model(tp2, gqa_path):
    tp2.reload(engine_config(gqa_path, 2))  # same ranks and process group, another model
    engine = LLMEngine(engine_config(gqa_path, 2), model_runner=tp2, skip_tokenizer_init=True)
    assert greedy(engine, PROMPTS) == tp1_tokens(gqa_path)


def test_tp2_matches_tp1_with_token_lists_shared_by_children(tp2, stories_path):
    """Each rank unpickles the requests' (read-only) token lists, shared by children, resent with every chunk."""
    tp2.reload(engine_config(stories_path, 2))
    base = SamplingParams(temperature=0.0, max_tokens=12, logit_bias={t: 3.0 for t in range(60, 90)},
                          allowed_token_ids=list(range(40, 200)), min_tokens=6, stop_token_ids=[61, 70])
    params = [base, base.child(seed=1), SamplingParams(temperature=0.0, max_tokens=8), base.child(seed=2)]
    engine = LLMEngine(engine_config(stories_path, 2), model_runner=tp2, skip_tokenizer_init=True)
    tokens = greedy(engine, PROMPTS, params=params)
    assert tokens == tp1_tokens(stories_path, params)
    assert all(40 <= t < 200 for t in tokens[0] + tokens[1] + tokens[3])


def test_dead_rank_fails_the_step_fast_and_marks_the_group_down(tp2, gqa_path, ray_session):
    engine = LLMEngine(engine_config(gqa_path, 2), model_runner=tp2, skip_tokenizer_init=True)
    ray_session.kill(tp2.workers[1], no_restart=True)
    engine.add_request(EngineRequest("r", [1, 40, 41], SamplingParams(temperature=0.0, max_tokens=4)))
    t0 = time.monotonic()
    outs = [o for o in engine.step() if o.finished]
    assert time.monotonic() - t0 < 30
    assert outs and outs[0].finish_reason == "error"
    assert tp2.dead_reason is not None and tp2.check_health() is not None
