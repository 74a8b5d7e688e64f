"""Decode CUDA graphs in the KV budget and on the engine thread (cuda_graph.py, "Memory and threads").

The capture itself needs CUDA; on CPU the runner's static decode path runs through the flash-attn
reference (block 256) with ``capture`` recorded instead of run and the device facts injected, so what
is checked is the order of things: the graphs are measured before the cache is sized and their bytes
leave the budget; they are captured on the thread that replays them, with its device made current.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest
from kvmesh.replica.attention import flash_attn_reference
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker import model_runner
from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode
from kvmesh.replica.worker.kv_cache import DeviceMemory, graph_memory, kv_cache_budget, module_bytes

GIB, MIB = 2**30, 2**20
BLOCK = 256


@pytest.fixture
def flash_reference(monkeypatch):
    import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)

    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module(allow_float32=True))


def graphed_engine(stories_path) -> tuple[LLMEngine, list]:
    """An engine whose runner takes the static decode path and "captures" (records the capturing thread and
    the block count of the cache the graphs would bake in)."""
    config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", attention_backend="flash_attn",
                          block_size=BLOCK, max_num_seqs=4, kv_cache_memory=1 << 24, hash_seed=b"s",
                          gpu_memory_utilization=0.5)
    engine = LLMEngine(config, skip_tokenizer_init=True)
    runner = engine.model_runner
    runner.static_decode = static = StaticDecode(runner.model, runner.attn_backend, 4,
                                                 runner.input_batch.block_tables.table.shape[1], BLOCK, runner.device)
    runner.capture_graphs = True
    captures = []
    static.capture = lambda: captures.append(
        (threading.current_thread().name, runner.model.attention_layers()[0].kv_cache.shape[1]))
    return engine, captures


def test_graph_memory_is_what_the_capture_took_from_the_device_and_leaves_the_kv_budget():
    def facts(free_gib: float, reserved_gib: float) -> DeviceMemory:
        return DeviceMemory(80 * GIB, int(free_gib * GIB), int(reserved_gib * GIB), int(reserved_gib * GIB),
                            16 * GIB)

    # the pool grew by 0.5 GiB and the instantiated graphs took 64 MiB outside torch's allocator
    before = facts(60, 18)
    after = DeviceMemory(80 * GIB, 60 * GIB - GIB // 2 - 64 * MIB, 18 * GIB, 18 * GIB + GIB // 2, 16 * GIB)
    graphs = graph_memory(before, after)
    assert graphs == GIB // 2 + 64 * MIB
    profiled_before, profiled_after = facts(62, 16), facts(60, 18)
    without = kv_cache_budget(profiled_before, profiled_after, 16 * GIB, 0.9)
    assert kv_cache_budget(profiled_before, profiled_after, 16 * GIB, 0.9, graphs=graphs) == without - graphs
    assert without == 72 * GIB - 16 * GIB - 2 * GIB - 2 * GIB  # share - weights - activations - outside
    with pytest.raises(ValueError, match=r"the decode CUDA graphs take 60.0 GiB.*cuda_graphs=False"):
        kv_cache_budget(profiled_before, profiled_after, 16 * GIB, 0.9, graphs=60 * GIB)


def test_the_graphs_are_measured_over_a_scratch_cache_before_the_kv_cache_is_sized(flash_reference, stories_path):
    engine, captures = graphed_engine(stories_path)
    runner = engine.model_runner
    bound = [attn.kv_cache for attn in runner.model.attention_layers()]
    weights, held = module_bytes(runner.model), GIB
    reads = iter([DeviceMemory(4 * GIB, 2 * GIB, held, held, held),  # before the profiling forward
                  DeviceMemory(4 * GIB, 2 * GIB, held + GIB // 4, held + GIB // 4, held),  # after it
                  DeviceMemory(4 * GIB, 2 * GIB - GIB // 4, 0, 0, 0),  # before the capture (scratch allocated)
                  DeviceMemory(4 * GIB, 2 * GIB - GIB // 4 - 96 * MIB, 0, 0, 0)])  # after it: 96 MiB of graphs
    calls = []
    runner.read_device_memory = lambda device: calls.append("read") or next(reads)
    runner.reset_peak_memory = lambda device: calls.append("reset")
    runner.static_decode.capture = lambda: calls.append("capture") or captures.append(
        runner.model.attention_layers()[0].kv_cache.shape[1])
    budget = runner.profiled_kv_budget()
    assert calls == ["read", "reset", "read", "read", "capture", "read"]
    assert captures == [1]  # over a one-block scratch cache (padding reads and writes block 0 only)
    non_torch = 2 * GIB - GIB // 4 - held
    assert budget == 2 * GIB - weights - GIB // 4 - non_torch - 96 * MIB
    assert [attn.kv_cache for attn in runner.model.attention_layers()] == bound  # the real cache bound again
    assert runner.static_decode.graphs == {}


def test_the_engine_thread_sets_its_device_and_captures_the_graphs_it_replays(flash_reference, stories_path,
                                                                             monkeypatch):
    engine, captures = graphed_engine(stories_path)
    runner = engine.model_runner
    prompt, params = [5, 9, 13, 17, 21], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    eager = LLMEngine(engine.config, skip_tokenizer_init=True)
    eager.add_request(EngineRequest("a", prompt, params))
    expected = []
    while eager.has_unfinished_requests():
        expected += [t for out in eager.step() for t in out.new_token_ids]
    devices = []
    monkeypatch.setattr(model_runner, "set_current_device",
                        lambda device: devices.append((threading.current_thread().name, device)))

    llm = AsyncLLM(engine=engine)
    try:
        async def collect():
            return [t async for out in llm.generate(prompt, params, request_id="a") for t in out.new_token_ids]

        assert asyncio.run(collect()) == expected
    finally:
        llm.shutdown()
    kv_blocks = runner.kv_cache.shape[2]  # flash layout [L, 2, num_blocks, block_size, heads, dim]
    assert captures == [("kvmesh-engine", kv_blocks)]  # once, over the real cache, where replay runs
    assert devices == [("kvmesh-engine", runner.device)]


def test_a_step_on_a_new_thread_binds_that_thread(flash_reference, stories_path):
    """A plain ``LLMEngine`` stepped from the caller's thread captures there, on its first step."""
    engine, captures = graphed_engine(stories_path)
    engine.add_request(EngineRequest("a", [5, 9, 13], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)))
    while engine.has_unfinished_requests():
        engine.step()
    assert [name for name, _ in captures] == [threading.current_thread().name]


@pytest.mark.gpu
def test_on_a_gpu_the_graphs_are_budgeted_then_captured_on_the_engine_thread(stories_path, monkeypatch):
    import torch
    from kvmesh.replica.engine.async_llm import AsyncLLM as Llm

    measured, captured, measure, capture = [], [], StaticDecode.measure_capture, StaticDecode.capture
    monkeypatch.setattr(StaticDecode, "measure_capture", lambda self, *a: measured.append(measure(self, *a)) or
                        measured[-1])
    monkeypatch.setattr(StaticDecode, "capture", lambda self: captured.append(threading.current_thread().name) or
                        capture(self))
    prompt, params = [5, 9, 13, 17, 21], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = {}
    for graphs in (False, True):
        config = EngineConfig(model=str(stories_path), dtype="bfloat16", device="cuda", attention_backend="triton",
                              block_size=16, max_num_seqs=8, gpu_memory_utilization=0.05, cuda_graphs=graphs,
                              hash_seed=b"s")
        llm = Llm.from_config(config)
        try:
            async def collect(llm=llm):
                return [t async for out in llm.generate(prompt, params, request_id="a") for t in out.new_token_ids]

            outs[graphs] = asyncio.run(collect())
            assert bool(llm.runner.static_decode and llm.runner.static_decode.graphs) == graphs
        finally:
            llm.shutdown()
        torch.cuda.empty_cache()
    assert outs[True] == outs[False]
    assert len(measured) == 1 and measured[0] > 0  # the graphs' bytes left the KV budget
    assert captured[0] == "MainThread" and captured[1:] == ["kvmesh-engine"]  # measured here, captured there
