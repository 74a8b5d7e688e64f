"""Async scheduling (vLLM's) gives the tokens synchronous scheduling gives, on stories260K.

With ``async_scheduling=True`` the engine launches step N+1 before it reads step N's tokens: decode rows
take their input ids from the previous step's sampled tensor, requests that stop at N run one wasted step,
and outputs reach the caller one step later. Every test runs the same requests both ways and compares
the tokens (and finish reasons) request by request.
"""

from __future__ import annotations

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

PROMPTS = {
    "a": [1, 403, 407, 261, 378],
    "b": [1, 403, 407, 261, 378, 445, 263, 265, 281, 398, 284, 425],
    "c": [1, 445, 263, 265, 281, 398, 284, 425, 264, 383, 270, 449, 262, 312, 289, 300, 301, 302, 303, 304],
    "d": [1, 264, 383, 270],
}


def engine(path, async_scheduling: bool, **kw) -> LLMEngine:
    config = EngineConfig(model=str(path), dtype="float32", device="cpu", block_size=4, kv_cache_memory=1 << 22,
                          async_scheduling=async_scheduling, debug_check_integrity=True, **kw)
    return LLMEngine(config)


def generate(eng: LLMEngine, params: dict[str, SamplingParams], abort_after: dict[str, int] | None = None,
             late: dict[str, int] | None = None) -> dict[str, tuple]:
    """Run to completion; ``late`` requests join once that many outputs were seen; ``abort_after`` requests
    are aborted once they produced that many tokens. Returns {id: (tokens, finish_reason, text)}."""
    seen, result, outputs = {}, {}, 0
    for rid, sp in params.items():
        if rid not in (late or {}):
            eng.add_request(EngineRequest(rid, PROMPTS[rid], sp))
    pending = dict(late or {})
    while eng.has_unfinished_requests() or pending:
        for out in eng.step():
            outputs += 1
            seen[out.request_id] = out.output_token_ids
            if out.finished:
                result[out.request_id] = (out.output_token_ids, out.finish_reason, out.text)
            elif abort_after and len(out.output_token_ids) >= abort_after.get(out.request_id, 1 << 30):
                eng.abort_request(out.request_id)
        for rid, after in list(pending.items()):
            if outputs >= after:
                eng.add_request(EngineRequest(rid, PROMPTS[rid], params[rid]))
                del pending[rid]
    return result


def both(path, params, engine_kw: dict | None = None, **kw) -> tuple[dict, dict, LLMEngine]:
    """(sync results, async results, the async engine) of the same requests."""
    eng = engine(path, True, **(engine_kw or {}))
    return generate(engine(path, False, **(engine_kw or {})), params, **kw), generate(eng, params, **kw), eng


def test_greedy_and_seeded_sampling_give_the_same_tokens(stories_path):
    params = {"a": SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
              "b": SamplingParams(temperature=0.8, seed=7, max_tokens=20, ignore_eos=True),
              "c": SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=3, max_tokens=16, ignore_eos=True),
              "d": SamplingParams(temperature=0.7, seed=11, min_tokens=5, max_tokens=12)}
    sync, async_, _ = both(stories_path, params, late={"d": 6})
    assert async_ == sync
    assert [len(sync[r][0]) for r in "abc"] == [24, 20, 16]


def test_stop_strings_eos_and_max_tokens_end_requests_at_the_same_token(stories_path):
    story = SamplingParams(temperature=0.0, max_tokens=60)
    stories = generate(engine(stories_path, False), {"a": story, "d": story})
    stop = stories["a"][2][20:26]  # a string from the middle of a's greedy story
    params = {"a": SamplingParams(temperature=0.0, max_tokens=60, stop=[stop]),
              "b": SamplingParams(temperature=0.0, max_tokens=7),
              "c": SamplingParams(temperature=0.9, seed=5, max_tokens=80),  # may reach EOS
              "d": SamplingParams(temperature=0.0, max_tokens=60, stop_token_ids=[stories["d"][0][5]])}
    sync, async_, _ = both(stories_path, params)
    assert async_ == sync
    assert sync["a"][1] == "stop" and sync["b"][1] == "length" and sync["d"][1] == "stop"


def test_preemption_gives_the_same_tokens(stories_path):
    params = {rid: SamplingParams(temperature=0.0 if rid in "ac" else 0.8, seed=2, max_tokens=28, ignore_eos=True)
              for rid in PROMPTS}
    sync, async_, eng = both(stories_path, params, engine_kw={"num_kv_blocks": 24})
    assert async_ == sync
    assert eng.get_stats().num_preemptions > 0


def test_abort_ends_a_request_and_leaves_the_others_unchanged(stories_path):
    params = {rid: SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True) for rid in "abc"}
    full = generate(engine(stories_path, False), params)
    sync, async_, eng = both(stories_path, params, abort_after={"b": 5})
    assert async_["a"] == sync["a"] == full["a"] and async_["c"] == sync["c"] == full["c"]
    tokens, reason, _ = async_["b"]
    assert reason == "abort" and 5 <= len(tokens) < 20 and tokens == full["b"][0][: len(tokens)]
    assert not eng.has_unfinished_requests() and eng.kv_cache_manager.usage == 0


def test_an_id_reused_right_after_its_abort_does_not_get_the_old_requests_token(stories_path):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = generate(engine(stories_path, False), {"b": params})["b"][0]
    eng = engine(stories_path, True)
    eng.add_request(EngineRequest("x", PROMPTS["a"], params))
    eng.step()
    eng.step()  # "x" has a token in flight now
    eng.abort_request("x")
    eng.add_request(EngineRequest("x", PROMPTS["b"], params))
    tokens = []
    while eng.has_unfinished_requests():
        tokens += [t for out in eng.step() if out.request_id == "x" for t in out.new_token_ids]
    assert tokens == expected


def test_async_scheduling_is_off_on_cpu_by_default_and_refused_for_a_runner_that_cannot_launch():
    config = EngineConfig(model="fake", load_format="dummy")
    assert LLMEngine(config, model_runner=FakeModelRunner(), skip_tokenizer_init=True).async_scheduling is False
    with pytest.raises(ValueError, match="async_scheduling=True needs a model runner that launches steps"):
        LLMEngine(EngineConfig(model="fake", load_format="dummy", async_scheduling=True),
                  model_runner=FakeModelRunner(), skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="async_scheduling must be true, false or null"):
        EngineConfig(model="fake", async_scheduling="yes")


@pytest.mark.gpu
def test_on_cuda_async_scheduling_is_the_default_and_gives_the_same_tokens(stories_path):
    def run(async_scheduling):
        config = EngineConfig(model=str(stories_path), dtype="float32", device="cuda", block_size=16,
                              gpu_memory_utilization=0.05, async_scheduling=async_scheduling)
        eng = LLMEngine(config)
        return eng.async_scheduling, generate(eng, params)

    params = {"a": SamplingParams(temperature=0.0, max_tokens=24),
              "b": SamplingParams(temperature=0.8, seed=7, max_tokens=20, ignore_eos=True),
              "c": SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=3, max_tokens=16, min_tokens=4)}
    on, async_ = run(None)
    assert on is True
    assert async_ == run(False)[1]
