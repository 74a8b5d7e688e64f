"""What the output text holds at its end (vLLM's rules): a stop token's text is not output, a stop string is cut off,
both are kept with ``include_stop_str_in_output``; special tokens show only with ``skip_special_tokens=False``."""

from __future__ import annotations

import pytest
from kvmesh.replica.llm import LLM
from kvmesh.replica.serving.detokenizer import IncrementalDetokenizer
from kvmesh.replica.serving.sampling_params import SamplingParams

PROMPT = "Once upon a time"
EOS = 2  # stories260K's </s>


@pytest.fixture(scope="module")
def llm(stories_path):
    return LLM(str(stories_path), kv_cache_memory=4 << 20)


def greedy(llm: LLM, **fields):
    return llm.generate(PROMPT, SamplingParams(max_tokens=12, temperature=0.0, **fields))[0]


def test_a_stop_tokens_text_is_not_output(llm):
    ids = greedy(llm).output_token_ids
    out = greedy(llm, stop_token_ids=[ids[5]])
    assert out.output_token_ids == ids[:6] and out.finish_reason == "stop"
    assert out.text == llm.get_tokenizer().decode(ids[:5], skip_special_tokens=True)


def test_a_stop_tokens_text_is_output_when_asked(llm):
    ids = greedy(llm).output_token_ids
    out = greedy(llm, stop_token_ids=[ids[5]], include_stop_str_in_output=True)
    assert out.text == llm.get_tokenizer().decode(ids[:6], skip_special_tokens=True)


def test_a_stop_string_is_cut_off_or_kept_when_asked(llm):
    word = greedy(llm).text.split()[2]
    assert greedy(llm, stop=[word]).text.endswith(" ")
    assert greedy(llm, stop=[word], include_stop_str_in_output=True).text.endswith(word)


def test_special_tokens_are_text_only_when_asked(llm):
    forced = {"logit_bias": {EOS: 100.0}, "ignore_eos": True, "max_tokens": 3, "temperature": 0.0}
    assert llm.generate(PROMPT, SamplingParams(**forced))[0].text == ""
    shown = llm.generate(PROMPT, SamplingParams(**forced, skip_special_tokens=False))[0].text
    assert shown == "</s></s></s>"


def test_a_kept_stop_string_streams_without_holding_text_back(llm):
    tokenizer, word = llm.get_tokenizer(), greedy(llm).text.split()[2]
    ids = greedy(llm).output_token_ids
    held = IncrementalDetokenizer(tokenizer, [1], SamplingParams(stop=[word]))
    kept = IncrementalDetokenizer(tokenizer, [1], SamplingParams(stop=[word], include_stop_str_in_output=True))
    held.update(ids[0]), kept.update(ids[0])
    assert len(kept.take_delta(False)) == len(kept.text) > len(held.take_delta(False))
