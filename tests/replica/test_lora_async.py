"""The engine's LoRA API without a model (the fake runner takes adapters as names): AsyncLLM's add / remove /
list and ``lora_request`` on generate, /load's lora section, and the scheduler's max_loras check."""

from __future__ import annotations

import asyncio

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

A, B = LoRARequest("a", 1, "/adapters/a"), LoRARequest("b", 2, "/adapters/b")


def fake_engine(**kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model="fake", block_size=4, hash_seed=b"s", debug_check_integrity=True, **kw),
                     model_runner=FakeModelRunner(num_kv_blocks=64, block_size=4), skip_tokenizer_init=True)


async def test_async_llm_adds_serves_reports_and_removes_an_adapter():
    engine = fake_engine(enable_lora=True, max_loras=2, max_lora_rank=8)
    engine.model_runner.step_delay = 0.05  # the request is still running when /load is read (200 steps: 10 s)
    llm = AsyncLLM(engine=engine)
    try:
        assert await llm.add_lora(A) and not await llm.add_lora(A)
        assert llm.list_loras() == [A]
        params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
        stream = llm.generate(EngineRequest("r", [1, 2, 3], params, lora_request=A))
        await stream.__anext__()
        lora = llm.load_report().lora
        assert (lora.enabled, lora.max_loras, lora.max_lora_rank, lora.adapters, lora.active) == (
            True, 2, 8, {"a": 0}, ["a"])
        await stream.aclose()
        assert await llm.remove_lora("a") and not await llm.remove_lora("a")
        assert llm.list_loras() == [] and llm.load_report().lora.adapters == {}
    finally:
        llm.shutdown()


async def test_without_enable_lora_an_adapter_is_refused_with_the_reason():
    llm = AsyncLLM(engine=fake_engine())
    try:
        with pytest.raises(ValueError, match="enable_lora"):
            await llm.add_lora(A)
        with pytest.raises(ValueError, match="enable_lora"):
            await asyncio.wait_for(llm.generate(EngineRequest("r", [1, 2], lora_request=A)).__anext__(), 5)
        assert not llm.load_report().lora.enabled
    finally:
        llm.shutdown()


def test_a_request_of_one_adapter_too_many_waits_in_place_while_later_ones_go():
    """max_loras=1: b's request waits for a's to end; the base request queued after b runs at once (vLLM's)."""
    engine = fake_engine(enable_lora=True, max_loras=1)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for rid, lora in (("a", A), ("b", B), ("base", None)):
        engine.add_request(EngineRequest(rid, [1, 2, 3], params, lora_request=lora))
    first_step, finished = None, []
    while engine.has_unfinished_requests():
        outs = engine.step()
        if first_step is None:
            first_step = {o.request_id for o in outs}
        finished += [o.request_id for o in outs if o.finished]
    assert first_step == {"a", "base"}
    assert finished.index("b") > finished.index("a")
    assert list(engine.scheduler.waiting) == []
