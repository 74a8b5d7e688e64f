"""A step that writes an adapter into a device slot teaches the engine's prefill rate its forward only.

The router prices an adapter's load apart (its bytes over ``/load``'s ``lora.load_bytes_per_s``); a prefill rate that
also carried the load would charge it twice, and a replica that just swapped adapters would look slower at prefill
than it is, enough to send a follow-up away from the replica holding its prefix."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from kvmesh.cluster.measure.benchmarks.support.peft_writer import write_lora_adapter  # noqa: E402
from kvmesh.replica.config import EngineConfig  # noqa: E402
from kvmesh.replica.engine.engine_request import EngineRequest  # noqa: E402
from kvmesh.replica.engine.llm_engine import LLMEngine  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

SLOW_LOAD_S = 1.0
PROMPT = [1] + [3 + (7 * i) % 500 for i in range(95)]


def test_a_slot_load_is_not_prefill_time(stories_path, tmp_path, monkeypatch):
    adapter = write_lora_adapter(stories_path, tmp_path / "a", seed=1)
    engine = LLMEngine(EngineConfig(model=str(stories_path), dtype="float32", device="cpu", enable_lora=True,
                                    max_lora_rank=8, max_loras=1, kv_cache_memory="4MiB",
                                    lora_modules={"a": str(adapter)}))
    lora = engine.model_runner.lora
    host_adapter = lora._host_adapter

    def slow_host_adapter(request):  # a slot load that takes SLOW_LOAD_S (a disk read on a busy machine)
        time.sleep(SLOW_LOAD_S)
        return host_adapter(request)

    monkeypatch.setattr(lora, "_host_adapter", slow_host_adapter)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine.add_request(EngineRequest("r", PROMPT, params, lora_request=engine.loras.registered["a"]))
    t0 = time.monotonic()
    while not any(out.finished for out in engine.step()):
        pass
    step_s = time.monotonic() - t0
    assert lora.load_seconds >= SLOW_LOAD_S and step_s >= SLOW_LOAD_S  # the load ran inside the step
    taught_s = len(PROMPT) / engine.prefill_rate.tokens_per_s
    assert taught_s < step_s - 0.9 * SLOW_LOAD_S, (taught_s, step_s)
