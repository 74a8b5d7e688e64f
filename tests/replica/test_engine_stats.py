"""Engine stats for /metrics: queue gauges, KV usage, prefix-cache tokens, preemptions, latency histograms."""

from __future__ import annotations

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.stats import Histogram
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner


def make_engine(num_blocks=64):
    runner = FakeModelRunner(num_kv_blocks=num_blocks, block_size=4)
    return LLMEngine(EngineConfig(model="fake", block_size=4, hash_seed=b"s"), model_runner=runner,
                     skip_tokenizer_init=True)


def drain(engine):
    while engine.has_unfinished_requests():
        engine.step()


def test_gauges_follow_the_queues_and_the_cache():
    engine = make_engine()
    engine.add_request(EngineRequest("a", list(range(1, 20)), SamplingParams(max_tokens=5)))
    assert engine.stats.num_waiting == 1 and engine.stats.num_running == 0
    engine.step()
    stats = engine.stats
    assert stats.num_running == 1 and stats.num_waiting == 0 and stats.kv_cache_usage > 0
    drain(engine)
    assert engine.stats.num_running == 0 and engine.stats.kv_cache_usage == 0.0


def test_prefix_cache_queries_and_hits_are_counted_in_tokens():
    engine = make_engine()
    prompt = list(range(1, 18))
    engine.add_request(EngineRequest("a", prompt, SamplingParams(max_tokens=1)))
    drain(engine)
    engine.add_request(EngineRequest("b", prompt, SamplingParams(max_tokens=1)))
    drain(engine)
    stats = engine.stats
    assert stats.prefix_cache_queries == 2 * len(prompt)
    assert stats.prefix_cache_hits == 16


def test_ttft_tpot_tokens_and_finish_reasons_are_recorded():
    engine = make_engine()
    engine.add_request(EngineRequest("a", [1, 2, 3], SamplingParams(max_tokens=4)))
    engine.add_request(EngineRequest("b", [4, 5], SamplingParams(max_tokens=10)))
    engine.step()
    engine.abort_request("b")
    drain(engine)
    stats = engine.stats
    assert stats.ttft.count == 2 and stats.tpot.count == 3
    assert stats.num_generation_tokens == 5 and stats.num_prompt_tokens == 5
    assert stats.num_finished == {"length": 1, "abort": 1}


def test_preemptions_are_counted():
    engine = make_engine(num_blocks=9)
    for i in range(3):
        engine.add_request(EngineRequest(f"r{i}", [i + 1] * 10, SamplingParams(max_tokens=12)))
    drain(engine)
    assert engine.stats.num_preemptions > 0


def test_histogram_buckets_are_cumulative_and_end_at_inf():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 3.0):
        h.observe(v)
    assert h.cumulative() == [(0.1, 1), (1.0, 3), (float("inf"), 4)]
    assert h.count == 4 and abs(h.sum - 4.25) < 1e-9
