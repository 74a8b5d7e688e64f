"""The engine's per-token logprobs rendered in vLLM's completions and chat shapes (torch-free)."""

from __future__ import annotations

import math

from kvmesh.replica.openai.logprobs_format import (
    chat_logprobs,
    choice_logprobs,
    completion_logprobs,
    distinct_candidates,
    prompt_logprobs,
    token_decoder,
)
from kvmesh.replica.step.outputs import TokenLogprobs

WORDS = {1: "<s>", 5: " Once", 6: " upon", 7: "re", 8: " a"}


def decode(token_id: int) -> str:
    return WORDS[token_id]


def test_completion_shape_has_the_chosen_token_then_the_top_k():
    entry = TokenLogprobs([6, 8, 6], [-0.5, -0.2, -0.5], rank=2)  # chosen " upon" is 2nd most likely
    out = completion_logprobs([6], [entry], num_logprobs=2, decode=decode)
    assert out == {"tokens": [" upon"], "token_logprobs": [-0.5], "top_logprobs": [{" upon": -0.5, " a": -0.2}],
                   "text_offset": [0]}


def test_completion_top_logprobs_hold_at_most_k_plus_one_distinct_tokens():
    entry = TokenLogprobs([7, 5, 6], [-3.0, -0.1, -0.4], rank=3)  # chosen token outside the top 2
    top = completion_logprobs([7], [entry], num_logprobs=2, decode=decode)["top_logprobs"][0]
    assert list(top) == ["re", " Once", " upon"]  # OpenAI: logprobs + 1 entries, the chosen one first (vLLM)
    assert completion_logprobs([7], [entry], num_logprobs=0, decode=decode)["top_logprobs"][0] == {"re": -3.0}


def test_echoed_first_prompt_token_has_null_logprobs_and_offsets_count_characters():
    entries = [None, TokenLogprobs([5], [-1.0], 4), TokenLogprobs([6], [-2.0], 1)]
    out = completion_logprobs([1, 5, 6], entries, num_logprobs=0, decode=decode)
    assert out["token_logprobs"] == [None, -1.0, -2.0] and out["top_logprobs"][0] is None
    assert out["tokens"] == ["<s>", " Once", " upon"] and out["text_offset"] == [0, 3, 8]
    later = completion_logprobs([8], [TokenLogprobs([8], [-0.3], 1)], 0, decode, initial_text_offset=13)
    assert later["text_offset"] == [13]


def test_choice_logprobs_put_the_echoed_prompt_before_the_output():
    prompt = [None, TokenLogprobs([5], [-1.0], 4), TokenLogprobs([6], [-2.0], 1)]
    out = choice_logprobs([1, 5, 6], prompt, [8], [TokenLogprobs([8], [-0.3], 1)], 0, decode, echo=True)
    assert out["tokens"] == ["<s>", " Once", " upon", " a"] and out["text_offset"] == [0, 3, 8, 13]
    assert out["token_logprobs"] == [None, -1.0, -2.0, -0.3]
    no_echo = choice_logprobs([1, 5, 6], prompt, [8], [TokenLogprobs([8], [-0.3], 1)], 0, decode, echo=False)
    assert no_echo["tokens"] == [" a"] and no_echo["text_offset"] == [0]


def test_minus_infinity_is_sent_as_minus_9999():
    entry = TokenLogprobs([7, 5], [-math.inf, 0.0], rank=9)
    out = completion_logprobs([7], [entry], num_logprobs=1, decode=decode)
    assert out["token_logprobs"] == [-9999.0] and out["top_logprobs"][0]["re"] == -9999.0


def test_chat_shape_lists_top_logprobs_with_bytes():
    entry = TokenLogprobs([5, 5, 8], [-0.1, -0.1, -2.5], rank=1)
    out = chat_logprobs([5], [entry], top_logprobs=2, decode=decode)
    assert out == {"content": [{
        "token": " Once", "logprob": -0.1, "bytes": list(b" Once"),
        "top_logprobs": [{"token": " Once", "logprob": -0.1, "bytes": list(b" Once")},
                         {"token": " a", "logprob": -2.5, "bytes": list(b" a")}]}]}
    assert chat_logprobs([5], [entry], top_logprobs=0, decode=decode)["content"][0]["top_logprobs"] == []


def test_distinct_candidates_keep_the_first_occurrence():
    entry = TokenLogprobs([6, 5, 6, 8], [-0.7, -0.2, -0.7, -3.0], rank=2)
    assert distinct_candidates(entry, 3) == [(6, -0.7), (5, -0.2), (8, -3.0)]


def test_token_decoder_restores_sentencepiece_leading_spaces(stories_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(stories_path)
    decode_one = token_decoder(tok)
    ids = tok.encode("Once upon a time", add_special_tokens=False)
    pieces = [decode_one(t) for t in ids]
    assert "".join(pieces).strip() == "Once upon a time"
    assert all(p.startswith(" ") for p in pieces[1:])  # "▁upon" -> " upon" (decode alone drops the space)


def test_prompt_logprobs_key_the_prompt_token_then_the_top_k_by_id_with_ranks():
    entries = [None, TokenLogprobs([6, 8, 6, 5], [-0.5, -0.2, -0.5, -3.0], rank=2), TokenLogprobs([7], [-math.inf], 9)]
    assert prompt_logprobs(entries, 2, decode) == [
        None,
        {"6": {"logprob": -0.5, "rank": 2, "decoded_token": " upon"},  # the prompt's, kept where it is in the top-k
         "8": {"logprob": -0.2, "rank": 1, "decoded_token": " a"}},
        {"7": {"logprob": -9999.0, "rank": 9, "decoded_token": "re"}},
    ]
