"""Every implementation satisfies the interface it stands in for (runtime_checkable Protocols).

The engine drives real, fake and Ray TP runners alike; the KV cache manager reads the engine's,
the simulator's and the benchmarks' requests alike; the HTTP server calls AsyncLLM through
EngineClient. A missing member shows up here, not as an AttributeError in a running replica.
"""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.replica import SimRequest
from kvmesh.kvcache.interfaces import CacheRequest, TokenRequest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.protocol import EngineClient
from kvmesh.replica.engine.request import Request
from kvmesh.replica.interfaces import ModelRunnerInterface
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner
from kvmesh.replica.worker.model_runner import ModelRunner
from kvmesh.replica.worker.tp_executor import RayTPExecutor
from kvmesh.replica.worker.tp_worker import RunnerFacts


@pytest.mark.parametrize("request_", [
    TokenRequest("a", [1, 2, 3]),
    Request(EngineRequest("b", [1, 2, 3], SamplingParams(max_tokens=1))),
    SimRequest("c", 0.0, (1,), 16, 1),
], ids=["TokenRequest", "engine Request", "SimRequest"])
def test_every_request_kind_is_a_cache_request(request_):
    assert isinstance(request_, CacheRequest)


def test_an_object_without_cache_salt_is_not_a_cache_request():
    class NoSalt:
        request_id, all_token_ids, num_computed_tokens, lora_name, num_tokens = "x", [], 0, None, 0
        lora_identity, skip_reading_prefix_cache = None, False

    assert not isinstance(NoSalt(), CacheRequest)


@pytest.fixture(scope="module")
def real_runner(stories_path):
    return ModelRunner(EngineConfig(model=str(stories_path), kv_cache_memory=1 << 20))


def test_real_and_fake_runners_are_model_runners(real_runner):
    assert isinstance(real_runner, ModelRunnerInterface)
    assert isinstance(FakeModelRunner(), ModelRunnerInterface)
    assert real_runner.check_health() is None


def test_ray_tp_executor_is_a_model_runner(real_runner):
    # The executor's facts come from its rank 0 worker; adopt them as TPWorker.load_model reports
    # them, without starting Ray (the executor's ranks are exercised in test_tp_equivalence.py).
    executor = RayTPExecutor.__new__(RayTPExecutor)
    executor.world_size = 1
    executor._adopt([RunnerFacts(num_kv_blocks=real_runner.num_kv_blocks, max_model_len=real_runner.max_model_len,
                                 vocab_size=real_runner.vocab_size, eos_token_ids=list(real_runner.eos_token_ids),
                                 device="cpu")])
    assert isinstance(executor, ModelRunnerInterface)


def test_a_runner_without_health_check_is_not_a_model_runner():
    runner = FakeModelRunner()
    type_without = type("NoHealth", (), {k: getattr(runner, k) for k in (
        "num_kv_blocks", "max_model_len", "vocab_size", "eos_token_ids", "dead_reason", "execute_model", "shutdown")})
    assert not isinstance(type_without(), ModelRunnerInterface)


def test_async_llm_is_the_engine_client_and_reports_a_broken_runner():
    runner = FakeModelRunner(num_kv_blocks=16, block_size=4)
    engine = LLMEngine(EngineConfig(model="fake", block_size=4, hash_seed=b"s"), model_runner=runner,
                       skip_tokenizer_init=True)
    llm = AsyncLLM(engine=engine)
    try:
        assert isinstance(llm, EngineClient)
        assert llm.dead_reason() is None
        runner.dead_reason = "a rank failed a step"
        assert llm.check_health() == "a rank failed a step"
    finally:
        llm.shutdown()
    assert llm.dead_reason() == "engine stopped"
