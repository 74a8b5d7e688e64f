"""Offline ``LLM.generate``: strings or token ids in, outputs in prompt order out."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvmesh.replica.llm import LLM  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def llm(stories_path):
    return LLM(str(stories_path), dtype="float32", kv_cache_memory=1 << 22)


def test_string_and_token_id_prompts_give_the_same_output(llm):
    ids = llm.get_tokenizer()("Once upon a time").input_ids
    by_text, by_ids = llm.generate(["Once upon a time", {"prompt_token_ids": ids}], GREEDY)
    assert by_text.prompt_token_ids == ids
    assert by_text.output_token_ids == by_ids.output_token_ids
    assert llm.generate(ids, GREEDY)[0].output_token_ids == by_ids.output_token_ids


def test_outputs_come_back_in_prompt_order_with_per_prompt_params(llm):
    prompts = ["One day", "Once upon a time", "The dog"]
    outs = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=n) for n in (3, 5, 7)])
    assert [len(o.output_token_ids) for o in outs] == [3, 5, 7]
    assert all(o.finished for o in outs)


def test_bad_prompt_raises_and_the_llm_still_works(llm):
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": []}], GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate("One day", GREEDY)[0].output_token_ids) == 8


def test_seeded_sampling_is_reproducible(llm):
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=123, max_tokens=10)
    a = llm.generate("Once upon a time", params)[0].output_token_ids
    b = llm.generate("Once upon a time", params)[0].output_token_ids
    assert a == b
