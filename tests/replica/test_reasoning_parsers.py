"""Reasoning parsers (deepseek_r1, qwen3) on hand-written model outputs: the splits vLLM's parsers make, whole and
streamed with the text cut at every character boundary (tags cut across deltas)."""

from __future__ import annotations

import pytest
from kvmesh.replica.openai.reasoning_parsers import (
    REASONING_PARSERS,
    ReasoningStream,
    reasoning_parser,
    split_reasoning,
)

R1_ANSWER = "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nThe answer is 4."
R1_PROMPT_OPENED = "Okay, 2+2 is 4.\n</think>\n\n4"  # R1's template wrote <think> into the prompt
QWEN3_CALL_IN_THINKING = "I need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"


def streamed(name: str, text: str, cuts: list[int], **kwargs) -> tuple[str, str]:
    """The reasoning and content deltas joined, for ``text`` fed in pieces ending at ``cuts``."""
    stream = ReasoningStream(reasoning_parser(name, kwargs or None))
    reasoning = content = ""
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for i, piece in enumerate(pieces):
        r, c = stream.feed(piece, final=i == len(pieces) - 1)
        reasoning, content = reasoning + r, content + c
    return reasoning, content


def whole_as_stream(reasoning: str | None, content: str | None) -> tuple[str, str]:
    return reasoning or "", content or ""


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize(("text", "expected"), [
    (R1_ANSWER, ("\nThe user asks 2+2. That is 4.\n", "\n\nThe answer is 4.")),
    (R1_PROMPT_OPENED, ("Okay, 2+2 is 4.\n", "\n\n4")),
    ("<think>still thinking when max_tokens hit", ("still thinking when max_tokens hit", None)),
    ("no tags at all", ("no tags at all", None)),
    ("<think>done</think>", ("done", None)),
    ("<think></think>Hi", ("", "Hi")),
    ("a</think>b</think>c", ("a", "b</think>c")),
    ("a</think>b<think>c", ("a", "b<think>c")),
    ("", ("", None)),
])
def test_both_parsers_split_as_vllm(name, text, expected):
    assert split_reasoning(name, text) == expected


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("text", [R1_ANSWER, R1_PROMPT_OPENED, "<think>no end <th</thi", "<<think>>a<</think>>b",
                                  "x <think> y </think> z", QWEN3_CALL_IN_THINKING, "<think>a<tool_call>b</think>c"])
def test_streamed_deltas_join_to_the_whole_split_for_every_single_cut(name, text):
    whole = whole_as_stream(*split_reasoning(name, text))
    for cut in range(len(text) + 1):
        assert streamed(name, text, [cut]) == whole, (cut, text)


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_streamed_one_character_at_a_time_matches_the_whole(name):
    for text in (R1_ANSWER, R1_PROMPT_OPENED, QWEN3_CALL_IN_THINKING):
        assert streamed(name, text, list(range(1, len(text)))) == whole_as_stream(*split_reasoning(name, text))


def test_a_tag_cut_across_deltas_is_held_back_until_it_is_whole_or_cannot_be():
    stream = ReasoningStream(reasoning_parser("deepseek_r1"))
    assert stream.feed("<thi") == ("", "")
    assert stream.feed("nk>Let me") == ("Let me", "")
    assert stream.feed(" see</th") == (" see", "")
    assert stream.feed("is") == ("</this", "")  # not the end tag after all
    assert stream.feed("</think") == ("", "")
    assert stream.feed(">\n4") == ("", "\n4")
    assert stream.feed(" and more </think>") == ("", " and more </think>")  # after the end: all content


def test_held_back_text_comes_out_when_the_answer_ends():
    stream = ReasoningStream(reasoning_parser("deepseek_r1"))
    assert stream.feed("thinking </thi") == ("thinking ", "")
    assert stream.feed("", final=True) == ("</thi", "")


def test_qwen3_with_thinking_off_answers_in_content_only():
    off = {"enable_thinking": False}
    assert split_reasoning("qwen3", "Hello there.", off) == (None, "Hello there.")
    assert streamed("qwen3", "Hello </think> there.", [3, 9], enable_thinking=False) == ("", "Hello </think> there.")
    assert split_reasoning("qwen3", "Hello", {"enable_thinking": True}) == ("Hello", None)
    # deepseek_r1 has no such switch
    assert split_reasoning("deepseek_r1", "Hello", off) == ("Hello", None)


def test_qwen3_ends_its_reasoning_at_a_call_made_from_inside_the_thinking():
    reasoning, content = split_reasoning("qwen3", QWEN3_CALL_IN_THINKING)
    assert reasoning == "I need the weather.\n"
    assert content.startswith("<tool_call>\n<function=get_weather>")


def test_qwen3_keeps_a_tool_call_tag_without_a_function_in_the_reasoning():
    assert split_reasoning("qwen3", "maybe <tool_call> later</think>ok") == ("maybe <tool_call> later", "ok")
    assert split_reasoning("qwen3", "maybe <tool_call>") == ("maybe <tool_call>", None)
    # deepseek_r1 does not read tool calls in its reasoning
    assert split_reasoning("deepseek_r1", QWEN3_CALL_IN_THINKING) == (QWEN3_CALL_IN_THINKING, None)


def test_qwen3_holds_a_possible_call_back_until_the_function_tag_decides():
    stream = ReasoningStream(reasoning_parser("qwen3"))
    assert stream.feed("hmm <tool_call>\n") == ("hmm ", "")
    assert stream.feed("<func") == ("", "")
    assert stream.feed("tion=f>") == ("", "<tool_call>\n<function=f>")


def test_the_registry_names_vllms_parsers():
    assert set(REASONING_PARSERS) == {"deepseek_r1", "qwen3"}
    assert all(cls.name == name for name, cls in REASONING_PARSERS.items())
