"""A Responses request as the chat request it becomes (replica/openai/responses_api/request.py, items.py), and the
400s naming what is wrong or not served."""

from __future__ import annotations

import pytest
from kvmesh.replica.openai.errors import parse_request
from kvmesh.replica.openai.responses_api.request import REFUSED, ResponsesRequest
from kvmesh.replica.serving.errors import ProtocolError


def chat(history=(), **body) -> dict:
    req = parse_request(ResponsesRequest, body)
    req.check_supported()
    return req.chat_body(list(history))


def refusal(**body) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        chat(**body)
    assert e.value.status_code == 400
    return e.value


def test_text_input_is_one_user_message_after_the_instructions_and_the_history():
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    body = chat(history, input="c", instructions="be brief", max_output_tokens=5, temperature=0.5, model="m")
    assert body["messages"] == [{"role": "system", "content": "be brief"}, *history, {"role": "user", "content": "c"}]
    assert body["max_completion_tokens"] == 5 and body["temperature"] == 0.5 and body["model"] == "m"
    assert chat(input="x", reasoning={"effort": "low"})["reasoning_effort"] == "low"
    assert "stream_options" not in body and "response_format" not in body


def test_items_become_messages_calls_and_tool_answers():
    body = chat(input=[
        {"role": "user", "content": "weather?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me see"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"rome\"}",
         "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and "},
                                                         {"type": "input_text", "text": "now?"}]}])
    assert body["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "let me see", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"rome\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "and now?"}]


def test_tools_tool_choice_and_the_text_format_take_the_chats_shapes():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = chat(input="x", tools=[{"type": "function", "name": "f", "parameters": schema, "strict": True}],
                tool_choice="auto", text={"format": {"type": "json_schema", "name": "out", "schema": schema}},
                stream=True)
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}]
    assert body["tool_choice"] == "auto" and body["stream_options"] == {"include_usage": True}
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    named = chat(input="x", tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "f"},
                 text={"format": {"type": "json_object"}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert "response_format" not in named  # a forced call has no text to shape
    assert chat(input="x", text={"format": {"type": "json_object"}})["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input.0.content.0"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "input.0.type"),
    ({"input": [{"type": "message", "role": "critic", "content": "x"}]}, "input.0.role"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
    ({"input": [3]}, "input.0"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ({"input": "x", "text": {"verbosity": "high"}}, "text.verbosity"),
    ({"input": "x", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata"),
    ({}, "input"),
])
def test_what_is_wrong_is_a_400_naming_it(body, param):
    assert refusal(**body).param == param


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_field_not_served_is_a_400_naming_it_and_its_unset_value_passes(name):
    unset = REFUSED[name].unset[-1]
    chat(input="x", **{name: unset})
    error = refusal(input="x", **{name: {"set": True}})
    assert error.param == name and name in error.message


@pytest.mark.parametrize(("field", "value"), [
    ("store", "yes"), ("stream", 1), ("max_output_tokens", "5"), ("max_output_tokens", 2.5), ("temperature", "hot"),
    ("input", {"role": "user"}), ("previous_response_id", "r" * 129), ("user", "u" * 513), ("metadata", {"k": 1}),
    ("tools", "f"), ("instructions", ["x"]), ("parallel_tool_calls", "no"), ("max_output_tokens", 0),
    ("prompt_cache_key", "k" * 513), ("reasoning", "high"), ("text", "json"),
])
def test_a_value_of_the_wrong_type_or_size_is_a_400_naming_the_field(field, value):
    with pytest.raises(ProtocolError) as e:
        parse_request(ResponsesRequest, {"input": "x", field: value})
    assert e.value.status_code == 400 and field in e.value.message
