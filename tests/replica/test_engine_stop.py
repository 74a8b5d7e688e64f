"""Stop checks: EOS (unless ignore_eos), stop token ids, max_tokens, min_tokens."""

from __future__ import annotations

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

PROMPT = [11, 12, 13]


def make_engine(eos=()) -> LLMEngine:
    runner = FakeModelRunner(num_kv_blocks=64, block_size=4, vocab_size=1000, eos_token_ids=eos)
    return LLMEngine(EngineConfig(model="fake", block_size=4, hash_seed=b"s"), model_runner=runner,
                     skip_tokenizer_init=True)


def generate(engine: LLMEngine, params: SamplingParams):
    engine.add_request(EngineRequest("r", PROMPT, params))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs[-1]


def expected(n: int) -> list[int]:
    return FakeModelRunner(vocab_size=1000).reference_generate(PROMPT, n)


def test_max_tokens_ends_with_length():
    out = generate(make_engine(), SamplingParams(temperature=0.0, max_tokens=6))
    assert out.finish_reason == "length" and out.output_token_ids == expected(6)


def test_eos_ends_with_stop_and_is_returned():
    tokens = expected(10)
    out = generate(make_engine(eos=(tokens[3],)), SamplingParams(temperature=0.0, max_tokens=10))
    assert out.finish_reason == "stop" and out.output_token_ids == tokens[:4] and out.stop_reason is None


def test_ignore_eos_keeps_going():
    tokens = expected(10)
    out = generate(make_engine(eos=(tokens[3],)), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    assert out.finish_reason == "length" and out.output_token_ids == tokens


def test_stop_token_id_is_reported_as_stop_reason():
    tokens = expected(10)
    out = generate(make_engine(), SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[tokens[2]]))
    assert out.finish_reason == "stop" and out.stop_reason == tokens[2] and out.output_token_ids == tokens[:3]


def test_min_tokens_defers_eos_and_stop_tokens():
    tokens = expected(10)
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=5, stop_token_ids=[tokens[1]])
    out = generate(make_engine(eos=(tokens[2],)), params)
    assert len(out.output_token_ids) >= 5 and out.output_token_ids == tokens[: len(out.output_token_ids)]


def test_every_step_streams_one_new_token():
    engine = make_engine()
    engine.add_request(EngineRequest("r", PROMPT, SamplingParams(temperature=0.0, max_tokens=4)))
    streamed = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert len(out.new_token_ids) == 1
            streamed += out.new_token_ids
    assert streamed == expected(4)
