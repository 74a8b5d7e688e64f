"""AsyncLLM: streaming, concurrency, abort on cancellation, a bad request fails only itself."""

from __future__ import annotations

import asyncio

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner


@pytest.fixture
def llm():
    runner = FakeModelRunner(num_kv_blocks=128, block_size=4)
    engine = LLMEngine(EngineConfig(model="fake", block_size=4, hash_seed=b"s", debug_check_integrity=True),
                       model_runner=runner, skip_tokenizer_init=True)
    runner.step_delay = 0.002
    llm = AsyncLLM(engine=engine)
    yield llm
    llm.shutdown()


async def collect(llm, rid, prompt, n):
    outs = [o async for o in llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=n), request_id=rid)]
    return outs


async def test_generate_streams_tokens_until_finished(llm):
    outs = await collect(llm, "a", [1, 2, 3], 5)
    assert [t for o in outs for t in o.new_token_ids] == outs[-1].output_token_ids
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert outs[-1].output_token_ids == llm.engine.model_runner.reference_generate([1, 2, 3], 5)


async def test_concurrent_requests_all_finish(llm):
    results = await asyncio.gather(*(collect(llm, f"r{i}", [i + 1] * (i + 2), 4 + i) for i in range(10)))
    for i, outs in enumerate(results):
        assert len(outs[-1].output_token_ids) == 4 + i


async def test_invalid_request_raises_and_others_keep_running(llm):
    good = asyncio.create_task(collect(llm, "good", [5, 6], 8))
    with pytest.raises(ValueError, match="prompt is empty"):
        await collect(llm, "bad", [], 3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await collect(llm, "bad2", [10**9], 3)
    outs = await good
    assert outs[-1].finish_reason == "length"


async def test_cancelling_a_stream_aborts_its_request(llm):
    gen = llm.generate([1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True), request_id="long")
    first = await gen.__anext__()
    assert not first.finished
    await gen.aclose()
    for _ in range(200):
        if not llm.engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert not llm.engine.has_unfinished_requests()
    assert llm.get_stats().num_finished.get("abort") == 1


async def test_task_cancellation_aborts_its_request(llm):
    streaming = asyncio.Event()

    async def consume():
        async for _ in llm.generate([4, 5], SamplingParams(max_tokens=400), request_id="c"):
            streaming.set()
            await asyncio.sleep(0.001)  # a consumer that takes its time: the cancel lands mid-stream

    task = asyncio.create_task(consume())
    await asyncio.wait_for(streaming.wait(), timeout=10)  # the request is running: it has sent output
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if not llm.engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert not llm.engine.has_unfinished_requests()


async def test_runner_error_fails_only_that_request(llm):
    llm.engine.model_runner.fail_on.add("doomed")
    outs = await collect(llm, "doomed", [1, 2], 4)
    assert outs[-1].finish_reason == "error" and "injected failure" in outs[-1].error
    llm.engine.model_runner.fail_on.clear()
    outs = await collect(llm, "fine", [1, 2], 4)
    assert outs[-1].finish_reason == "length"
