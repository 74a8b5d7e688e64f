"""A chat answer as a Response (replica/openai/responses_api/output.py) and a chat stream as its ``response.*``
events in OpenAI's order (events.py), through the service over a fake chat call (service.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.errors import parse_request
from kvmesh.replica.openai.responses_api.output import from_chat, response_object
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from kvmesh.replica.openai.responses_api.service import Answer, ResponsesService
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore
from kvmesh.replica.serving.errors import ProtocolError

USAGE = {"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}}


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return f"data: {json.dumps({'choices': choices, 'usage': usage})}\n\n".encode()


async def chat_stream(parts: list[bytes]):
    joined = b"".join(parts) + b"data: [DONE]\n\n"
    for i in range(0, len(joined), 7):  # cut anywhere: events span reads
        yield joined[i:i + 7]


def run(body: dict, answer: Answer, service: ResponsesService | None = None) -> tuple[Answer, ResponsesService]:
    service = service or ResponsesService(SQLiteResponseStore(FrontendConfig()), lambda: "m")

    async def call(chat_body: dict) -> Answer:
        return answer

    async def go():
        got = await service.create(parse_request(ResponsesRequest, body), "ann", call)
        if got.stream is not None:
            got.body = b"".join([event async for event in got.stream])
        return got

    return asyncio.run(go()), service


def events_of(raw: bytes) -> list[dict]:
    events = []
    for block in raw.decode().split("\n\n")[:-1]:
        kind, data = block.split("\n")
        assert kind == "event: " + json.loads(data[6:])["type"]
        events.append(json.loads(data[6:]))
    return events


def test_a_whole_answer_becomes_output_items_usage_and_status():
    req = parse_request(ResponsesRequest, {"input": "x", "max_output_tokens": 3})
    chat = {"choices": [{"message": {"content": "hi", "reasoning_content": "think", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "length"}],
            "usage": USAGE}
    done = from_chat(response_object(req, "resp_1", "m"), chat)
    assert [item["type"] for item in done["output"]] == ["reasoning", "message", "function_call"]
    assert done["output"][0]["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert done["output"][2]["call_id"] == "c1" and done["output"][2]["name"] == "f"
    assert done["status"] == "incomplete" and done["incomplete_details"] == {"reason": "max_output_tokens"}
    assert done["usage"]["input_tokens_details"]["cached_tokens"] == 32 and done["usage"]["total_tokens"] == 43


def test_streamed_text_then_calls_send_every_event_in_order_and_store_the_response():
    parts = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}), chunk({"content": "lo"}),
             chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                    "function": {"name": "f", "arguments": ""}}]}),
             chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}),
             chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}, "tool_calls"),
             chunk(usage=USAGE)]
    got, service = run({"input": "x", "stream": True}, Answer(stream=chat_stream(parts)))
    events = events_of(got.body)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Hello" and final["output"][1]["arguments"] == "{\"a\": 1}"
    assert final["usage"]["input_tokens"] == 40
    stored = service.store.get("ann", final["id"])
    assert stored.conversation[-1] == {"role": "assistant", "content": "Hello", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}


def test_a_stream_that_errs_sends_error_then_response_failed_and_stores_nothing():
    parts = [chunk({"content": "a"}), b'data: {"error": {"message": "engine failed", "code": 500}}\n\n']
    got, service = run({"input": "x", "stream": True}, Answer(stream=chat_stream(parts)))
    events = events_of(got.body)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["message"] == "engine failed" and events[-1]["response"]["status"] == "failed"
    assert service.store.get("ann", events[-1]["response"]["id"]) is None


def test_a_chat_error_names_the_responses_field_and_keeps_its_status_and_headers():
    error = {"error": {"message": "max_tokens is too large", "param": "max_tokens", "code": 400}}
    got, _ = run({"input": "x"}, Answer(400, json.dumps(error).encode()))
    assert got.status == 400 and json.loads(got.body)["error"]["param"] == "max_output_tokens"
    shed = {"error": {"message": "queue full", "type": "rate_limit", "code": 429}}
    got, _ = run({"input": "x"}, Answer(429, json.dumps(shed).encode(), headers={"retry-after": "2"}))
    assert got.status == 429 and got.headers == {"retry-after": "2"}
    assert json.loads(got.body) == shed  # admission's type naming the reason, as it was


def test_a_continuation_renders_the_stored_conversation_first():
    first = {"choices": [{"message": {"content": "one"}, "finish_reason": "stop"}], "usage": USAGE}
    got, service = run({"input": "a", "instructions": "sys"}, Answer(body=json.dumps(first).encode()))
    seen = []

    async def call(body: dict) -> Answer:
        seen.append(body["messages"])
        return Answer(body=json.dumps(first).encode())

    req = parse_request(ResponsesRequest, {"input": "b", "previous_response_id": json.loads(got.body)["id"]})
    asyncio.run(service.create(req, "ann", call))
    assert seen == [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "one"},
                     {"role": "user", "content": "b"}]]  # instructions are not carried over (OpenAI's rule)
    with pytest.raises(ProtocolError) as e:
        asyncio.run(service.create(req, "bob", call))
    assert e.value.status_code == 404 and e.value.param == "previous_response_id"


def test_the_shapes_validate_as_openais_own_types():
    types = pytest.importorskip("openai.types.responses", reason="the OpenAI client is a dev dependency")
    from pydantic import TypeAdapter

    events = TypeAdapter(types.ResponseStreamEvent)
    parts = [chunk({"reasoning_content": "hm"}), chunk({"content": "Hi"}),
             chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}, "stop"),
             chunk(usage=USAGE)]
    got, _ = run({"input": "x", "stream": True, "tools": [{"type": "function", "name": "f"}],
                  "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
                  "metadata": {"k": "v"}}, Answer(stream=chat_stream(parts)))
    failed, _ = run({"input": "x", "stream": True}, Answer(stream=chat_stream(
        [chunk({"content": "a"}), b'data: {"error": {"message": "no", "code": 500}}\n\n'])))
    for event in events_of(got.body) + events_of(failed.body):  # every required field, every literal
        assert events.validate_python(event).type == event["type"]
    types.Response.model_validate(events_of(got.body)[-1]["response"])
    whole, _ = run({"input": "x"}, Answer(body=json.dumps(
        {"choices": [{"message": {"content": "a"}, "finish_reason": "length"}], "usage": USAGE}).encode()))
    assert types.Response.model_validate_json(whole.body).incomplete_details.reason == "max_output_tokens"


def test_a_stream_that_breaks_fails_the_response_with_events_not_a_traceback():
    got, _ = run({"input": "x", "stream": True},
                 Answer(stream=chat_stream([chunk({"content": "a"}), b"data: {nope\n\n"])))
    events = events_of(got.body)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "server_error"


def test_an_answer_that_failed_on_the_replica_is_a_failed_response_and_not_stored():
    failed = {"choices": [{"message": {"content": ""}, "finish_reason": "error"}], "usage": USAGE}
    got, service = run({"input": "x"}, Answer(body=json.dumps(failed).encode()))
    body = json.loads(got.body)
    assert body["status"] == "failed" and body["error"]["code"] == "server_error"
    assert service.store.get("ann", body["id"]) is None
    streamed, _ = run({"input": "x", "stream": True}, Answer(stream=chat_stream([chunk({"content": ""}, "error")])))
    assert events_of(streamed.body)[-1]["type"] == "response.failed"
