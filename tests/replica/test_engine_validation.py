"""Bad input fails only its own request, with an error that says what to fix; the engine keeps serving."""

from __future__ import annotations

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner


@pytest.fixture
def engine() -> LLMEngine:
    runner = FakeModelRunner(num_kv_blocks=600, block_size=16, vocab_size=1000, max_model_len=4096)
    config = EngineConfig(model="fake", hash_seed=b"seed", debug_check_integrity=True)
    eng = LLMEngine(config, model_runner=runner, skip_tokenizer_init=True)
    eng.add_request(EngineRequest("good", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5)))
    return eng


def finish(engine: LLMEngine) -> dict:
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return finals


def assert_rejected(engine: LLMEngine, match: str, **kw) -> None:
    args = {"request_id": "bad", "prompt_token_ids": [1, 2, 3], "sampling_params": SamplingParams(max_tokens=4)}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        engine.add_request(EngineRequest(**args))
    finals = finish(engine)
    assert "bad" not in finals
    assert finals["good"].finish_reason == "length" and len(finals["good"].output_token_ids) == 5


def test_prompt_longer_than_context(engine):
    assert_rejected(engine, r"^This model's maximum context length is 4096 tokens. However, you requested 16 output "
                    r"tokens and your prompt contains at least 5000 input tokens, for a total of at least 5016 tokens.",
                    prompt_token_ids=[5] * 5000, sampling_params=SamplingParams(max_tokens=16))


def test_max_tokens_beyond_context(engine):
    assert_rejected(engine, r"you requested 4000 output tokens and your prompt contains at least 100 input tokens, "
                    r"for a total of at least 4100 tokens",
                    prompt_token_ids=[5] * 100, sampling_params=SamplingParams(max_tokens=4000))


def test_empty_prompt(engine):
    assert_rejected(engine, "prompt is empty", prompt_token_ids=[])


def test_token_id_outside_vocabulary(engine):
    assert_rejected(engine, r"prompt token 1000 at position 1 is outside the vocabulary \[0, 1000\)",
                    prompt_token_ids=[1, 1000, 2])


def test_negative_token_id(engine):
    assert_rejected(engine, "outside the vocabulary", prompt_token_ids=[-1])


def test_invalid_sampling_values(engine):
    params = SamplingParams()
    params.top_p = 0.0  # mutated after construction: the engine re-validates
    assert_rejected(engine, "top_p must be in", sampling_params=params)


def test_invalid_sampling_values_at_construction():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)


def test_duplicate_request_id(engine):
    assert_rejected(engine, "already in use", request_id="good")


def test_request_bigger_than_the_whole_kv_cache():
    runner = FakeModelRunner(num_kv_blocks=5, block_size=16, max_model_len=4096)
    engine = LLMEngine(EngineConfig(model="fake", hash_seed=b"s"), model_runner=runner, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="needs 5 KV blocks .* holds only 4"):
        engine.add_request(EngineRequest("big", [1] * 70, SamplingParams(max_tokens=2)))


def test_stop_strings_need_a_tokenizer(engine):
    assert_rejected(engine, "stop strings need a tokenizer", sampling_params=SamplingParams(stop=["x"]))


def test_runner_failure_fails_only_the_scheduled_requests(engine):
    engine.model_runner.fail_on.add("doomed")
    engine.add_request(EngineRequest("doomed", [7, 8], SamplingParams(max_tokens=3)))
    outs = {o.request_id: o for o in engine.step()}
    assert outs["doomed"].finish_reason == "error" and "injected failure" in outs["doomed"].error
    engine.model_runner.fail_on.clear()
    engine.add_request(EngineRequest("later", [9], SamplingParams(temperature=0.0, max_tokens=2)))
    finals = finish(engine)
    assert finals["later"].finish_reason == "length"
