"""One ``EngineRequest`` per candidate, carried unchanged: what the OpenAI layer builds is what the scheduler's
``Request`` holds, so a per-request option is one field of the struct (engine/engine_request.py)."""

from __future__ import annotations

import asyncio

import msgspec
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.remote_kv import RemoteKV
from kvmesh.replica.server.parallel_sampling import plan_candidates, start_all
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

ADAPTER = LoRARequest("a", 1, "/adapters/a")
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


class WithOption(EngineRequest, frozen=True):
    """A per-request option added by a test: a field of the struct and nothing else."""

    tenant_tag: str = ""


def fake_engine() -> LLMEngine:
    engine = LLMEngine(EngineConfig(model="fake", block_size=4, hash_seed=b"s", enable_lora=True, max_loras=2,
                                    max_lora_rank=8, scheduling_policy="priority"),
                       model_runner=FakeModelRunner(num_kv_blocks=64, block_size=4), skip_tokenizer_init=True)
    engine.model_runner.step_delay = 0.02  # still running when the scheduler's requests are read
    return engine


def every_field_set(request_id: str = "r") -> EngineRequest:
    """Every field off its default."""
    return EngineRequest(request_id, [1, 2, 3, 4, 5], LONG, cache_salt="tenant-a", arrival_time=12.5,
                         lora_request=ADAPTER, priority=-1, remote_kv=RemoteKV(lease_ttl_s=5.0, peer="peer-b"))


def test_every_field_is_set_off_its_default_by_the_fixture():
    sent, default = every_field_set(), EngineRequest("r", [1])
    for name in EngineRequest.__struct_fields__:
        if name not in ("request_id", "prompt_token_ids"):
            assert getattr(sent, name) != getattr(default, name), f"every_field_set leaves {name} at its default"


def test_the_scheduler_request_holds_every_field_unchanged():
    engine = fake_engine()
    sent = every_field_set()
    engine.add_request(sent)
    request = engine.scheduler.requests["r"]
    assert request.engine_request is sent
    for name in EngineRequest.__struct_fields__:
        assert getattr(request.engine_request, name) is getattr(sent, name)
        if name in type(request).__slots__:  # what the scheduler reads of it directly
            assert getattr(request, name) == getattr(sent, name), name


def test_the_candidates_of_a_request_copy_every_field_of_the_first():
    first = WithOption("cmpl-1", [1, 2], LONG, cache_salt="s", lora_request=ADAPTER, priority=3,
                       remote_kv=RemoteKV(lease_ttl_s=1.0), tenant_tag="blue")
    candidates = plan_candidates(first, [[1, 2], [3, 4]], [LONG, LONG], 2, None, False)
    assert [c.request_id for c in candidates] == ["cmpl-1-0", "cmpl-1-1", "cmpl-1-2", "cmpl-1-3"]
    assert [c.request.prompt_token_ids for c in candidates] == [[1, 2], [1, 2], [3, 4], [3, 4]]
    assert [c.request.remote_kv for c in candidates] == [first.remote_kv, None, None, None]  # one pull, one lease
    per_candidate = {"request_id", "prompt_token_ids", "sampling_params", "remote_kv"}
    for c in candidates:
        assert type(c.request) is WithOption
        for name in set(WithOption.__struct_fields__) - per_candidate:
            assert getattr(c.request, name) == getattr(first, name), name
    assert plan_candidates(first, [[1, 2]], [LONG], 1, None, False)[0].request is first


async def test_a_field_added_to_the_struct_reaches_the_scheduler_with_no_other_edit():
    llm = AsyncLLM(engine=fake_engine())
    try:
        await llm.add_lora(ADAPTER)
        first = WithOption("cmpl-2", [1, 2, 3], LONG, cache_salt="s", lora_request=ADAPTER, priority=-2,
                           tenant_tag="blue")
        candidates = plan_candidates(first, [[1, 2, 3]], [LONG], 2, None, False)
        streams = await asyncio.wait_for(start_all(llm, candidates), 10)  # the server's path below the OpenAI layer
        for c in candidates:
            held = llm.engine.scheduler.requests[c.request_id].engine_request
            assert held is c.request and msgspec.structs.asdict(held)["tenant_tag"] == "blue"
        for stream in streams:
            await stream.aclose()  # aborts them
    finally:
        llm.shutdown()
