"""The engine measures the request phases it reports (vLLM v1's definitions): queue, prefill, decode,
inference, end to end; plus the per-request token histograms and tokens per engine step."""

from __future__ import annotations

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.stats import EngineStats
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

STEP_S = 0.02  # each model step sleeps this long, so every phase has a known lower bound


def make_engine(max_num_seqs=8, step_delay=STEP_S):
    runner = FakeModelRunner(num_kv_blocks=64, block_size=4, max_model_len=512)
    runner.step_delay = step_delay
    config = EngineConfig(model="fake", block_size=4, hash_seed=b"s", max_num_seqs=max_num_seqs)
    return LLMEngine(config, model_runner=runner, skip_tokenizer_init=True), runner


def drain(engine):
    while engine.has_unfinished_requests():
        engine.step()


def test_prefill_and_decode_phases_cover_their_model_steps():
    engine, _ = make_engine()
    engine.add_request(EngineRequest("a", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)))
    drain(engine)
    s = engine.stats
    assert s.e2e_latency.count == s.queue_time.count == s.prefill_time.count == s.decode_time.count == 1
    assert s.prefill_time.sum >= STEP_S  # the prefill step
    assert s.decode_time.sum >= 3 * STEP_S  # three decode steps for tokens 2..4
    assert s.inference_time.sum == pytest.approx(s.prefill_time.sum + s.decode_time.sum)
    assert s.e2e_latency.sum >= s.queue_time.sum + s.inference_time.sum
    assert s.request_tpot.sum == pytest.approx(s.decode_time.sum / 3)


def test_queue_time_is_the_wait_for_a_free_sequence_slot():
    engine, _ = make_engine(max_num_seqs=1)
    engine.add_request(EngineRequest("first", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)))
    engine.add_request(EngineRequest("second", [4, 5, 6], SamplingParams(max_tokens=4, ignore_eos=True)))
    drain(engine)
    queue = engine.stats.queue_time
    assert queue.count == 2
    assert queue.sum >= 4 * STEP_S  # "second" waited while "first" ran its 4 steps (first waited ~0)


def test_token_histograms_record_each_finished_request():
    engine, _ = make_engine(step_delay=0.0)
    engine.add_request(EngineRequest("a", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)))
    engine.add_request(EngineRequest("b", list(range(1, 11)), SamplingParams(max_tokens=2, ignore_eos=True)))
    drain(engine)
    s = engine.stats
    assert (s.request_prompt_tokens.count, s.request_prompt_tokens.sum) == (2, 13)
    assert (s.request_generation_tokens.count, s.request_generation_tokens.sum) == (2, 6)
    assert s.request_max_tokens.sum == 6


def test_iteration_tokens_count_every_token_the_model_computed():
    engine, runner = make_engine(step_delay=0.0)
    engine.add_request(EngineRequest("a", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)))
    drain(engine)
    hist = engine.stats.iteration_tokens
    assert hist.count == runner.num_steps == 4
    assert hist.sum == 3 + 3  # the prompt, then one token per decode step (the last sample is never computed)


def test_a_request_aborted_while_waiting_has_a_latency_but_no_phases():
    engine, _ = make_engine()
    engine.add_request(EngineRequest("a", [1, 2, 3], SamplingParams(max_tokens=4)))
    engine.abort_request("a")
    drain(engine)
    s = engine.stats
    assert s.e2e_latency.count == 1 and s.num_finished == {"abort": 1}
    assert s.queue_time.count == s.prefill_time.count == s.decode_time.count == 0


def test_token_count_buckets_end_at_the_models_context_length():
    engine, _ = make_engine()
    assert engine.stats.request_prompt_tokens.buckets[-3:] == (100, 200, 500)  # max_model_len = 512
    assert EngineStats.for_model(2048).request_generation_tokens.buckets[-1] == 2000
