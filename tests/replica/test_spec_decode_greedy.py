"""Speculative decoding gives the tokens plain decoding gives (greedy), on stories260K, with n-gram drafts and
with a draft model (stories260K with noise on its weights: some drafts accepted, most rejected).

Each test runs the same requests on an engine without and with ``speculative_config`` and compares tokens and
finish reasons request by request; each also checks that drafts were accepted, so the speculative path ran.
"""

from __future__ import annotations

import functools
import time

import pytest

pytest.importorskip("torch")

from kvmesh.events.schema import BlockStored  # noqa: E402
from kvmesh.replica.config import EngineConfig  # noqa: E402
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

from .draft_models import draft_spec  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = {
    "a": [1, 403, 407, 261, 378],
    "b": [1, 403, 407, 261, 378, 445, 263, 265, 281, 398, 284, 425],
    "c": [1, 445, 263, 265, 281, 398, 284, 425, 264, 383, 270, 449, 262, 312, 289, 300, 301, 302, 303, 304],
    "d": [1, 264, 383, 270],
}


class RecordingPublisher:
    def __init__(self) -> None:
        self.events: list = []

    def publish(self, events) -> None:
        self.events += events

    def close(self) -> None:
        pass


@pytest.fixture(params=["ngram", "draft_model"])
def spec(request) -> dict:
    """``speculative_config`` of each method."""
    return NGRAM if request.param == "ngram" else draft_spec(request.getfixturevalue("perturbed_draft"))


def engine(path, spec: dict | None, publisher=None, **kw) -> LLMEngine:
    config = EngineConfig(model=str(path), dtype="float32", device="cpu", block_size=4, kv_cache_memory=1 << 22,
                          debug_check_integrity=True, hash_seed="spec", speculative_config=spec, **kw)
    return LLMEngine(config, event_publisher=publisher)


def generate(eng: LLMEngine, params: dict[str, SamplingParams], one_by_one: bool = False) -> dict[str, tuple]:
    """Run to completion (``one_by_one``: each request after the previous one ended); {id: (tokens, reason)}."""
    result: dict[str, tuple] = {}
    order = list(params)
    for batch in ([[rid] for rid in order] if one_by_one else [order]):
        for rid in batch:
            eng.add_request(EngineRequest(rid, PROMPTS[rid[0]], params[rid]))
        for _ in range(2000):
            if not eng.has_unfinished_requests():
                break
            for out in eng.step():
                if out.finished:
                    result[out.request_id] = (list(out.output_token_ids), out.finish_reason)
    return result


_PLAIN: dict[str, tuple[dict[str, tuple], list]] = {}
"""Plain runs by their requests and engine options: both methods' cases compare against one run without drafts."""


def plain_run(path, params: dict[str, SamplingParams], engine_kw: dict | None = None,
              one_by_one: bool = False) -> tuple[dict[str, tuple], list]:
    """The results of ``generate`` on an engine without drafts, and the events it published."""
    key = repr((str(path), sorted(params.items()), sorted((engine_kw or {}).items()), one_by_one))
    if key not in _PLAIN:
        events = RecordingPublisher()
        _PLAIN[key] = generate(engine(path, None, events, **(engine_kw or {})), params, one_by_one), events.events
    return _PLAIN[key]


_COMPARED: dict[str, LLMEngine] = {}
"""Speculative engines ``compare`` ran, by their runs (a method's batch case and a draft-model case run alike)."""


def compare(path, spec, params, engine_kw: dict | None = None, one_by_one: bool = False) -> LLMEngine:
    """Assert equal results without and with drafts; returns the speculative engine."""
    key = repr((str(path), spec, sorted(params.items()), sorted((engine_kw or {}).items()), one_by_one))
    if key not in _COMPARED:
        _COMPARED[key] = _compare(path, spec, params, engine_kw, one_by_one)
    return _COMPARED[key]


def _compare(path, spec, params, engine_kw: dict | None, one_by_one: bool) -> LLMEngine:
    spec_engine = engine(path, spec, **(engine_kw or {}))
    plain = plain_run(path, params, engine_kw, one_by_one)[0]
    spec = generate(spec_engine, params, one_by_one)
    assert spec == plain
    assert len(spec) == len(params)
    assert spec_engine.scheduler.drafter.stats.num_accepted_tokens > 0
    return spec_engine


def greedy(n: int = 40, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def test_plain_greedy_batch_gives_the_same_tokens(stories_path, spec):
    eng = compare(stories_path, spec, {rid: greedy(48) for rid in PROMPTS})
    stats = eng.scheduler.drafter.stats
    assert stats.num_draft_tokens >= stats.num_accepted_tokens > 0
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens


def test_the_target_as_its_own_draft_model_has_almost_every_draft_accepted(stories_path):
    eng = compare(stories_path, draft_spec(stories_path), {rid: greedy(48) for rid in PROMPTS})
    stats = eng.scheduler.drafter.stats
    assert stats.num_accepted_tokens >= 0.95 * stats.num_draft_tokens > 0


def test_a_draft_model_with_noisy_weights_has_most_drafts_rejected(stories_path, perturbed_draft):
    eng = compare(stories_path, draft_spec(perturbed_draft), {rid: greedy(48) for rid in PROMPTS})
    stats = eng.scheduler.drafter.stats
    assert 0 < stats.num_accepted_tokens < 0.5 * stats.num_draft_tokens


def test_the_draft_cache_of_ended_requests_is_given_back(stories_path):
    eng = engine(stories_path, draft_spec(stories_path))
    generate(eng, {"a": greedy(12), "b": greedy(40)})  # b drafts on after a ended
    proposer = eng.scheduler.drafter.draft_model
    assert set(proposer.states) == {"b"}
    held = sum(len(s.block_ids) for s in proposer.states.values())
    assert len(proposer.free) + held == proposer.model.num_blocks - 1


def test_max_tokens_eos_and_stop_tokens_end_at_the_same_token(stories_path, spec):
    params = {"a": greedy(7), "b": SamplingParams(temperature=0.0, max_tokens=60),
              "c": greedy(30, stop_token_ids=[300]), "d": greedy(1)}
    compare(stories_path, spec, params)


def test_prefix_cached_requests_give_the_same_tokens(stories_path, spec):
    params = {"a1": greedy(), "b1": greedy(), "a2": greedy(), "b2": greedy()}  # *2 hit the cache of *1
    compare(stories_path, spec, params, one_by_one=True)


def test_chunked_prefill_gives_the_same_tokens(stories_path, spec):
    compare(stories_path, spec, {rid: greedy(40) for rid in PROMPTS}, {"max_num_batched_tokens": 8})


def test_preemption_gives_the_same_tokens(stories_path, spec):
    eng = compare(stories_path, spec, {rid: greedy(48) for rid in PROMPTS}, {"num_kv_blocks": 24})
    assert eng.scheduler.num_preemptions > 0


def test_requests_with_penalties_or_logprobs_decode_one_token_per_step(stories_path, spec):
    params = {"a": greedy(30, repetition_penalty=1.3), "b": greedy(30, logprobs=2), "c": greedy(30)}
    eng = compare(stories_path, spec, params)
    assert eng.scheduler.drafter.stats.num_ineligible == 2


def structured_run(path, config: dict | None) -> tuple[LLMEngine, dict]:
    """A regex-constrained request beside a free one, to completion."""
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

    eng, done = engine(path, config), {}
    eng.add_request(EngineRequest("a", PROMPTS["a"], SamplingParams(
        temperature=0.0, max_tokens=24, structured_outputs=StructuredOutputsParams(regex="[a-z ]{8,40}"))))
    eng.add_request(EngineRequest("c", PROMPTS["c"], greedy(30)))
    deadline = time.monotonic() + 60  # the grammar compiles in another process meanwhile
    while eng.has_unfinished_requests() and time.monotonic() < deadline:
        done |= {o.request_id: (list(o.output_token_ids), o.finish_reason) for o in eng.step() if o.finished}
    eng.close()
    return eng, done


@functools.cache
def structured_plain(path) -> dict:
    return structured_run(path, None)[1]


def test_structured_output_requests_decode_one_token_per_step(stories_path, spec):
    plain, (eng, spec_done) = structured_plain(stories_path), structured_run(stories_path, spec)
    assert spec_done == plain and set(spec_done) == {"a", "c"}
    assert eng.scheduler.drafter.stats.num_ineligible == 1
    assert eng.scheduler.drafter.stats.num_accepted_tokens > 0  # the free request drafted


def test_a_migrated_streams_continuation_gives_the_same_tokens(stories_path, spec):
    """What the router sends another replica when a stream's replica dies: the prompt and the output so far as token
    ids; the continuation with drafts must go on exactly as one uninterrupted plain run."""
    whole = plain_run(stories_path, {"b": greedy(40)})[0]["b"][0]
    cut = 15
    eng = engine(stories_path, spec)
    eng.add_request(EngineRequest("b-continued", PROMPTS["b"] + whole[:cut], greedy(40 - cut)))
    rest = []
    for _ in range(2000):
        if not eng.has_unfinished_requests():
            break
        rest += [t for out in eng.step() if out.finished for t in out.output_token_ids]
    assert rest == whole[cut:]
    assert eng.scheduler.drafter.stats.num_accepted_tokens > 0


def test_no_block_of_a_rejected_draft_is_stored_or_published(stories_path, spec):
    params = {rid: greedy(48) for rid in PROMPTS}
    plain_events, spec_events = plain_run(stories_path, params)[1], RecordingPublisher()
    eng = engine(stories_path, spec, spec_events)
    generate(eng, params)
    stats = eng.scheduler.drafter.stats
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0  # some drafts were rejected

    def stored(events) -> list[tuple]:
        return sorted((h, tuple(e.token_ids[i * e.block_size:(i + 1) * e.block_size]))
                      for e in events if isinstance(e, BlockStored) for i, h in enumerate(e.block_hashes))

    assert stored(spec_events.events) == stored(plain_events)
    assert stored(spec_events.events)


@pytest.fixture(scope="module")
def adapter(stories_path, tmp_path_factory):
    """A LoRA adapter of stories260K, made once for both methods."""
    pytest.importorskip("peft")
    from .lora_fixtures import make_adapter

    path = tmp_path_factory.mktemp("lora") / "a1"
    make_adapter(stories_path, path, seed=1)
    return path


def lora_run(path, adapter, config: dict | None) -> tuple[LLMEngine, dict]:
    """Requests a and b with the adapter, c and d without, to completion."""
    from kvmesh.replica.serving.lora_request import LoRARequest

    lora = LoRARequest("a1", 1, str(adapter))
    eng = engine(path, config, enable_lora=True, max_lora_rank=8)
    for rid in PROMPTS:
        eng.add_request(EngineRequest(rid, PROMPTS[rid], greedy(40), lora_request=lora if rid in "ab" else None))
    done = {}
    for _ in range(2000):
        if not eng.has_unfinished_requests():
            break
        done.update({o.request_id: list(o.output_token_ids) for o in eng.step() if o.finished})
    return eng, done


@functools.cache
def lora_plain(path, adapter) -> dict:
    return lora_run(path, adapter, None)[1]


def test_lora_requests_give_the_same_tokens(stories_path, spec, adapter):
    plain, (eng, done) = lora_plain(stories_path, adapter), lora_run(stories_path, adapter, spec)
    assert plain == done and len(done) == len(PROMPTS)
    assert eng.scheduler.drafter.stats.num_accepted_tokens > 0


async def test_streamed_tokens_and_text_add_up_to_the_final_output(stories_path, spec):
    from kvmesh.replica.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_config(EngineConfig(model=str(stories_path), dtype="float32", device="cpu",
                                            speculative_config=spec))
    try:
        tokens, text, last = [], "", None
        async for out in llm.generate(PROMPTS["b"], greedy(60)):
            tokens, text, last = tokens + out.new_token_ids, text + out.delta_text, out
        assert tokens == last.output_token_ids and len(tokens) == 60
        assert text == last.text
        assert llm.engine.scheduler.drafter.stats.num_accepted_tokens > 0
    finally:
        llm.shutdown()
