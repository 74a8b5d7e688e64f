"""Tool-call parsers (hermes, llama3_json, forced) on real-looking model outputs, whole and streamed in pieces
split at every awkward point."""

from __future__ import annotations

import json
import random

import pytest
from kvmesh.replica.openai.tool_parsers import TOOL_PARSERS
from kvmesh.replica.openai.tool_parsers.forced import NamedToolCall, RequiredToolCalls
from kvmesh.replica.openai.tool_parsers.stream import ToolCallStream, answer

HERMES = TOOL_PARSERS["hermes"]()
LLAMA3 = TOOL_PARSERS["llama3_json"]()
QWEN_TWO_CALLS = (  # Qwen2.5-7B-Instruct's answer to a two-city weather question
    "Let me check both cities.\n<tool_call>\n"
    '{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA", "unit": "celsius"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_current_temperature", "arguments": {"location": "Tokyo, \\"JP\\" {x}", "unit": "celsius"}}\n'
    "</tool_call>")
LLAMA_TAGGED = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "San Francisco", "days": [1, 2]}}'
LLAMA_TWO = '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": "}"}}'


def names_and_arguments(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_reads_content_before_the_calls_and_every_call():
    content, calls = answer(HERMES, QWEN_TWO_CALLS)
    assert content == "Let me check both cities.\n"
    assert names_and_arguments(calls) == [
        ("get_current_temperature", {"location": "San Francisco, CA, USA", "unit": "celsius"}),
        ("get_current_temperature", {"location": 'Tokyo, "JP" {x}', "unit": "celsius"})]
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


def test_hermes_without_a_call_is_plain_content():
    assert answer(HERMES, "Once upon a time <tool") == ("Once upon a time <tool", [])


def test_hermes_with_broken_json_is_plain_content():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1]}\n</tool_call>'
    assert answer(HERMES, text) == (text, [])


def test_a_call_cut_short_is_plain_content():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1'
    assert answer(HERMES, text) == (text, [])


def test_parallel_tool_calls_false_keeps_the_first_call():
    _, calls = answer(HERMES, QWEN_TWO_CALLS, parallel=False)
    assert [c["function"]["name"] for c in calls] == ["get_current_temperature"]


def test_llama3_json_reads_the_python_tag_form():
    assert answer(LLAMA3, LLAMA_TAGGED)[0] is None
    assert names_and_arguments(answer(LLAMA3, LLAMA_TAGGED)[1]) == [
        ("get_weather", {"city": "San Francisco", "days": [1, 2]})]


def test_llama3_json_reads_calls_separated_by_semicolons_and_either_arguments_key():
    assert names_and_arguments(answer(LLAMA3, LLAMA_TWO)[1]) == [("a", {"x": 1}), ("b", {"y": "}"})]


def test_llama3_json_text_that_starts_otherwise_is_content():
    assert answer(LLAMA3, 'Sure: {"name": "a"}') == ('Sure: {"name": "a"}', [])


def test_a_call_without_arguments_has_empty_ones():
    assert names_and_arguments(answer(LLAMA3, '{"name": "now"}')[1]) == [("now", {})]


def test_a_name_that_is_not_a_string_is_content():
    assert answer(LLAMA3, '{"name": 3, "parameters": {}}')[1] == []


def test_required_reads_an_array_of_name_and_parameters():
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "now", "parameters": {}}]'
    assert names_and_arguments(answer(RequiredToolCalls(), text)[1]) == [("get_weather", {"city": "Paris"}),
                                                                          ("now", {})]


def test_named_reads_the_whole_output_as_the_arguments():
    content, calls = answer(NamedToolCall("get_weather"), ' {"city": "Paris"}')
    assert content is None and names_and_arguments(calls) == [("get_weather", {"city": "Paris"})]


def stream(parser, pieces):
    """(content, calls as {index: [name, arguments]}, the order names and arguments came in) of a streamed answer."""
    s = ToolCallStream(parser)
    content, calls, order = "", {}, []
    for n, piece in enumerate(pieces):
        delta, deltas = s.feed(piece, final=n == len(pieces) - 1)
        content += delta
        for d in deltas:
            if "id" in d:
                assert d["index"] not in calls and d["type"] == "function" and d["function"]["name"]
                calls[d["index"]] = [d["function"]["name"], ""]
                order.append(("name", d["index"]))
            assert d["index"] in calls, "arguments before the call's name"
            if d["function"].get("arguments"):
                calls[d["index"]][1] += d["function"]["arguments"]
                order.append(("arguments", d["index"]))
    return content, calls, order


def splits(text, seed):
    """Every split in two, and random splits into 1-3 character pieces."""
    yield from ([text[:i], text[i:]] for i in range(len(text) + 1))
    rng = random.Random(seed)
    for _ in range(20):
        pieces, at = [], 0
        while at < len(text):
            step = rng.randint(1, 3)
            pieces.append(text[at:at + step])
            at += step
        yield pieces


@pytest.mark.parametrize("parser, text", [(HERMES, QWEN_TWO_CALLS), (LLAMA3, LLAMA_TAGGED), (LLAMA3, LLAMA_TWO),
                                          (RequiredToolCalls(),
                                           '[{"name": "f", "parameters": {"a": [1, {"b": "]"}]}}]'),
                                          (NamedToolCall("f"), '{"a": "x\\"y", "n": 12}'),
                                          (NamedToolCall("f"), json.dumps({"path": "C:\\", "q": '\\"}'}))])
def test_streamed_deltas_split_anywhere_join_to_the_whole_answer(parser, text):
    content, calls = answer(parser, text)
    for pieces in splits(text, seed=len(text)):
        got_content, got_calls, order = stream(parser, pieces)
        assert got_content == (content or ""), pieces
        assert [tuple(got_calls[i]) for i in sorted(got_calls)] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in calls], pieces
        assert order[0][0] == "name"


def test_streamed_hermes_holds_back_a_partial_tag_and_sends_it_when_it_is_not_one():
    s = ToolCallStream(HERMES)
    assert s.feed("Hello <tool_") == ("Hello ", [])
    assert s.feed("box> ok", final=True) == ("<tool_box> ok", [])


def test_streamed_name_comes_once_whole():
    s = ToolCallStream(HERMES)
    assert s.feed('<tool_call>{"name": "get_wea') == ("", [])
    _, deltas = s.feed('ther", "arguments": {"ci')
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": '{"ci'}


def test_streamed_text_that_turns_unreadable_becomes_content():
    s = ToolCallStream(LLAMA3)
    assert s.feed("{") == ("", [])
    assert s.feed(" oops", final=True) == ("{ oops", [])


def test_the_server_flags_name_a_known_parser_and_auto_needs_one():
    from kvmesh.replica.openai.config import FrontendConfig

    with pytest.raises(ValueError, match="hermes, llama3_json"):
        FrontendConfig(tool_call_parser="mistral-ish")
    with pytest.raises(ValueError, match="tool_call_parser"):
        FrontendConfig(enable_auto_tool_choice=True)
    assert FrontendConfig(enable_auto_tool_choice=True,
                          tool_call_parser="llama3_json").tool_call_parser == "llama3_json"



TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _tools_request():
    from kvmesh.replica.openai.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[{"role": "user", "content": "weather?"}], tools=TOOLS)


@pytest.mark.parametrize("tool_call_parser, skips", [("hermes", False), ("llama3_json", True), (None, True)])
def test_hermes_reads_special_tokens_and_other_parsers_leave_the_request_alone(tool_call_parser, skips):
    """vLLM's hermes ``adjust_request``: with tools and a tool choice other than "none", special tokens are kept."""
    req = _tools_request()
    req.adjust_for_tool_parser(tool_call_parser)
    assert req.to_sampling_params(4, 512).skip_special_tokens is skips
    plain = _tools_request().model_copy(update={"tool_choice": "none"})
    plain.adjust_for_tool_parser(tool_call_parser)
    assert plain.to_sampling_params(4, 512).skip_special_tokens is True


def test_a_tokenizer_whose_tool_call_tags_are_special_still_yields_hermes_calls(stories_path):
    """Qwen's and Hermes' tokenizers mark ``<tool_call>`` special: were the tags stripped before the parser saw
    them, the call would come back as text."""
    from kvmesh.replica.server.chat_tools import message
    from kvmesh.replica.serving.detokenizer import IncrementalDetokenizer
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    hf = load_tokenizer(stories_path).hf
    hf.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    req = _tools_request()
    req.adjust_for_tool_parser("hermes")
    detok = IncrementalDetokenizer(hf, [1, 2, 3, 4], req.to_sampling_params(4, 512))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    for token in hf.encode(call, add_special_tokens=False):
        detok.update(token)
    answered, reason = message(req, "hermes", "", detok.take_delta(True), "stop")
    assert reason == "tool_calls" and answered.content is None
    assert names_and_arguments(answered.tool_calls) == [("get_weather", {"city": "Rome"})]


def test_a_streamed_call_that_turns_unreadable_is_not_sent_again_as_content():
    """vLLM's streaming parsers skip what they cannot read once a call is out: the client keeps the call it got
    (so ``finish_reason`` "tool_calls" matches it) and never sees the call's text again as content."""
    from kvmesh.replica.server.chat_tools import delta

    req = _tools_request()
    stream = ToolCallStream(HERMES)
    pieces = ["Sure.", '<tool_call>\n{"name": "get_weather", ', '"arguments": {"a": 1', "]] oops", " more", ""]
    deltas = [delta(req, stream, piece, "stop" if i == len(pieces) - 1 else None) for i, piece in enumerate(pieces)]
    content = "".join(d.content or "" for d, _ in deltas if d is not None)
    assert content == "Sure."
    calls = [c for d, _ in deltas if d is not None for c in d.tool_calls or []]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"a": 1'
    assert deltas[-1][1] == "tool_calls"


def test_text_that_is_unreadable_before_any_call_is_announced_stays_content():
    stream = ToolCallStream(HERMES)
    assert stream.feed("Sure. <tool_call>\n{\"name\": 5") == ("Sure. ", [])
    assert stream.feed(", oops}", final=True) == ('<tool_call>\n{"name": 5, oops}', [])
    assert not stream.called
