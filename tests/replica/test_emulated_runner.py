"""The emulated replica's engine: the real scheduler and cache, steps that wait out a timing profile, hashed tokens."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from kvmesh.events.schema import BlockStored
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.emulate import timing
from kvmesh.replica.emulate.config import EmulationConfig
from kvmesh.replica.emulate.cost_model import CostModel
from kvmesh.replica.emulate.runner import EmulatedModelRunner
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

from .test_engine_events import RecordingPublisher

HF = {"vocab_size": 512, "max_position_embeddings": 4096, "eos_token_id": 2}


def emulated_engine(tmp_path, profile: dict | str = "h100-8b", publisher=None, **engine_kwargs) -> LLMEngine:
    emulate = profile
    if isinstance(profile, dict):
        (tmp_path / "profile.json").write_text(json.dumps(profile))
        emulate = str(tmp_path / "profile.json")
    emulation = EmulationConfig(emulate=emulate, **{k: engine_kwargs.pop(k) for k in list(engine_kwargs)
                                                    if k.startswith("emulate_")})
    config = EngineConfig(model=str(tmp_path), hf_config=HF, hash_seed=b"seed", emulation=emulation, **engine_kwargs)
    return LLMEngine(config, skip_tokenizer_init=True, event_publisher=publisher)


def generate(engine: LLMEngine, prompts: dict[str, list[int]], **params) -> dict[str, list[int]]:
    for rid, prompt in prompts.items():
        engine.add_request(EngineRequest(rid, prompt, SamplingParams(temperature=0.0, **params)))
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return tokens


def test_the_engine_builds_an_emulated_runner_sized_by_the_profile(tmp_path):
    engine = emulated_engine(tmp_path, kv_cache_memory="64MiB")
    assert isinstance(engine.model_runner, EmulatedModelRunner)
    assert engine.num_kv_blocks == (64 << 20) // (16 * 131_072)  # the 8B's 128 KiB per token
    assert engine.max_model_len == 4096 and engine.vocab_size == 512


def test_tokens_avoid_eos_and_honour_max_tokens(tmp_path):
    out = generate(emulated_engine(tmp_path), {"a": list(range(5, 40))}, max_tokens=200)
    assert len(out["a"]) == 200
    assert 2 not in out["a"] and min(out["a"]) >= 3


def test_emulate_eos_lets_outputs_end_early(tmp_path):
    engine = emulated_engine(tmp_path, emulate_eos=True, emulate_time_dilation=0.01)
    out = generate(engine, {f"r{i}": [7 + i] * 20 for i in range(8)}, max_tokens=2000)
    assert any(len(t) < 2000 and t[-1] == 2 for t in out.values())


def test_the_same_prompt_gives_the_same_tokens_cached_or_not(tmp_path):
    engine = emulated_engine(tmp_path, emulate_time_dilation=0.01)
    prompt = list(range(10, 60))
    first = generate(engine, {"a": prompt}, max_tokens=12)["a"]
    second = generate(engine, {"b": prompt}, max_tokens=12)["b"]  # from the prefix cache this time
    assert first == second
    assert engine.get_stats().prefix_cache_hits > 0


def test_a_preempted_request_resumes_with_the_tokens_it_had(tmp_path):
    prompts = {f"r{i}": list(range(100 * i + 3, 100 * i + 35)) for i in range(4)}
    roomy = generate(emulated_engine(tmp_path, emulate_time_dilation=0.01), prompts, max_tokens=40)
    tight = emulated_engine(tmp_path, emulate_time_dilation=0.01, num_kv_blocks=12, block_size=8)
    assert generate(tight, prompts, max_tokens=40) == roomy
    assert tight.get_stats().num_preemptions > 0


def sleeps_of_the_clock(monkeypatch) -> list[float]:
    """The seconds each of the step clock's waits asked for (they still sleep). A loaded machine makes a sleep
    longer, never what the clock asks: these bound the clock's own doing whatever the load."""
    asked: list[float] = []

    def sleep(seconds: float) -> None:
        asked.append(seconds)
        time.sleep(seconds)

    clock_time = SimpleNamespace(monotonic=time.monotonic, thread_time=time.thread_time, sleep=sleep)
    monkeypatch.setattr(timing, "time", clock_time)
    return asked


def test_steps_take_the_profile_time_times_the_dilation(tmp_path, monkeypatch):
    table = {"prefill": [[1, 0.010], [1000, 0.060]], "decode": [[1, 128, 0.020], [8, 128, 0.030]]}
    for dilation in (1.0, 2.0):
        engine = emulated_engine(tmp_path, table, emulate_time_dilation=dilation)
        asked = sleeps_of_the_clock(monkeypatch)
        t0 = time.monotonic()
        generate(engine, {"a": list(range(3, 103))}, max_tokens=5)  # one prefill step of 100, then 4 decodes
        wall = time.monotonic() - t0
        expected = dilation * (0.010 + 0.050 * 99 / 999 + 4 * 0.020)
        clock = engine.model_runner.clock
        assert clock.num_steps == 5
        assert clock.busy_s == pytest.approx(expected, rel=1e-6)
        assert wall >= expected  # never early
        assert sum(asked) <= expected + 1e-9  # never waits longer than planned: any lateness is the machine's
        report = clock.report()
        assert report.late_s_p50 is not None and 0 <= report.late_s_p50 <= report.late_s_p99
        assert report.cpu_s_per_step is not None and report.cpu_s_per_step < 0.05


def test_back_to_back_steps_hide_the_host_work(tmp_path, monkeypatch):
    """A step sharing a request with the one before starts when that one's wait ended, not when it was launched."""
    engine = emulated_engine(tmp_path, {"prefill": [[1, 0.04], [100, 0.04]], "decode": [[1, 1, 0.04]]})
    runner = engine.model_runner
    real_step = runner.clock.run_step

    def slow_host(seconds, continues):  # 20 ms of host work before every launch
        time.sleep(0.02)
        return real_step(seconds, continues)

    runner.clock.run_step = slow_host
    asked = sleeps_of_the_clock(monkeypatch)
    t0 = time.monotonic()
    generate(engine, {"a": [5, 6, 7]}, max_tokens=6)
    wall = time.monotonic() - t0
    assert runner.clock.num_steps == 6 and wall >= 6 * 0.04 + 0.02  # never early
    # Hidden: each later step's 20 ms (or more, on a loaded machine) of host work comes out of its 40 ms wait, so
    # the waits ask at most 40 + 5 x 20 ms; added to every step, each would wait the whole 40 ms (240 ms).
    assert asked[0] == pytest.approx(0.04) and sum(asked) <= 0.04 + 5 * 0.02 + 1e-6, asked


def test_a_host_tier_store_lands_when_its_step_ends(tmp_path):
    engine = emulated_engine(tmp_path, emulate_time_dilation=0.01, kv_offload_memory="8MiB")
    assert engine.model_runner.num_host_blocks > 1
    prompt = list(range(3, 3 + 64))
    generate(engine, {"a": prompt}, max_tokens=2)
    generate(engine, {"b": [9] * 8}, max_tokens=2)  # a step later: the first prompt's copies have landed
    assert engine.kv_cache_manager.offload.host.usage() > 0


def test_the_emulated_engine_publishes_what_a_model_free_engine_does(tmp_path):
    """Same tokens, same block size, same seed: the prompt's BlockStored events are equal to FakeModelRunner's."""
    prompt = list(range(3, 3 + 70))
    emulated = RecordingPublisher()
    generate(emulated_engine(tmp_path, publisher=emulated, emulate_time_dilation=0.01), {"a": prompt}, max_tokens=1)
    fake = RecordingPublisher()
    engine = LLMEngine(EngineConfig(model="fake", hash_seed=b"seed"), model_runner=FakeModelRunner(num_kv_blocks=64),
                       skip_tokenizer_init=True, event_publisher=fake)
    generate(engine, {"a": prompt}, max_tokens=1)
    assert stored(emulated.batches) == stored(fake.batches)
    assert sum(len(e.block_hashes) for e in stored(fake.batches)) == 4  # 70 tokens: 4 full blocks of 16


def stored(batches: list[list]) -> list[BlockStored]:
    return [e for batch in batches for e in batch if isinstance(e, BlockStored)]


def test_the_emulated_step_time_is_the_simulators(tmp_path):
    runner = emulated_engine(tmp_path).model_runner
    assert runner.profile == CostModel()


@pytest.mark.parametrize("bad, says", [
    ("a100-70b", "neither a named profile"),
    ("/no/such/profile.json", "neither a named profile"),
])
def test_an_unknown_profile_is_refused_by_name(bad, says):
    with pytest.raises(ValueError, match=says):
        EmulationConfig(emulate=bad)


def test_a_profile_file_that_is_no_table_is_refused_naming_it(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"prefill": [[1, -1]], "decode": [[1, 1, 0.01]]}))
    with pytest.raises(ValueError, match="p.json.*>= 0"):
        EmulationConfig(emulate=str(tmp_path / "p.json")).profile()
    (tmp_path / "q.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="q.json.*JSON object"):
        EmulationConfig(emulate=str(tmp_path / "q.json")).profile()


def test_emulation_refuses_what_it_cannot_time():
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        EngineConfig(model="m", tensor_parallel_size=2, emulation=EmulationConfig(emulate="h100-8b"))
    with pytest.raises(ValueError, match="emulate_time_dilation"):
        EmulationConfig(emulate="h100-8b", emulate_time_dilation=0)
