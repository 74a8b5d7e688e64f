"""Details of a Response against OpenAI's: reasoning read from vLLM's ``reasoning`` as from ``reasoning_content``;
an answer cut at ``max_output_tokens`` leaves its last item ``incomplete``; a stream that ends with the request's own
error (a choice's ``finish_reason: "error"`` with its ``error``) fails with that client error, never a server error
to retry; a cancelled stream ends with ``response.incomplete`` whose status is ``cancelled`` (OpenAI has no
cancelled event); a stored response's input items, listed as OpenAI lists them."""

from __future__ import annotations

import asyncio
import json

import pytest
from kvmesh.replica.openai.errors import parse_request
from kvmesh.replica.openai.responses_api.output import from_chat, response_object
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from kvmesh.replica.openai.responses_api.service import Answer
from kvmesh.replica.serving.errors import ProtocolError

from .test_response_events import USAGE, chat_stream, chunk, events_of, run

CLIENT_ERROR = {"message": "tools.0.function.parameters: the grammar allows no text", "type": "BadRequestError",
                "param": "tools", "code": 400}


def whole(message: dict, finish: str = "stop") -> dict:
    req = parse_request(ResponsesRequest, {"input": "x", "max_output_tokens": 3})
    return from_chat(response_object(req, "resp_1", "m"), {"choices": [{"message": message, "finish_reason": finish}],
                                                          "usage": USAGE})


@pytest.mark.parametrize("fields", [{"reasoning": "think"}, {"reasoning_content": "think"},
                                    {"reasoning": "think", "reasoning_content": "think"}])
def test_reasoning_is_read_from_either_name_once(fields):
    done = whole({"content": "hi", **fields})
    assert [item["type"] for item in done["output"]] == ["reasoning", "message"]
    assert done["output"][0]["content"] == [{"type": "reasoning_text", "text": "think"}]
    got, _ = run({"input": "x", "stream": True}, Answer(stream=chat_stream([
        chunk({k: "thi" for k in fields}), chunk({k: "nk" for k in fields}), chunk({"content": "hi"}, "stop")])))
    final = events_of(got.body)[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "think"


def test_an_answer_cut_at_max_output_tokens_leaves_its_message_incomplete():
    done = whole({"content": "Once upon"}, "length")
    assert done["status"] == "incomplete" and done["incomplete_details"] == {"reason": "max_output_tokens"}
    assert done["output"][-1]["status"] == "incomplete"
    assert whole({"content": "The end."})["output"][-1]["status"] == "completed"


def test_a_streamed_answer_cut_at_max_output_tokens_leaves_its_last_item_incomplete():
    got, service = run({"input": "x", "stream": True}, Answer(stream=chat_stream([
        chunk({"reasoning": "hm"}), chunk({"content": "Once"}), chunk({"content": " upon"}, "length"),
        chunk(usage=USAGE)])))
    events = events_of(got.body)
    done = [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["completed", "incomplete"]  # the reasoning ended before the cut; the message was cut
    final = events[-1]
    assert final["type"] == "response.incomplete" and final["response"]["output"][-1]["status"] == "incomplete"
    assert service.store.get("ann", final["response"]["id"]).response["output"][-1]["status"] == "incomplete"


def test_a_stream_ending_with_its_own_error_fails_with_that_client_error():
    failed = {"choices": [{"index": 0, "delta": {}, "finish_reason": "error", "error": CLIENT_ERROR}]}
    got, service = run({"input": "x", "stream": True}, Answer(stream=chat_stream([
        chunk({"content": ""}), f"data: {json.dumps(failed)}\n\n".encode()])))
    events = events_of(got.body)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    error, failed = events[-2], events[-1]["response"]
    assert error["code"] == "BadRequestError" and error["message"] == CLIENT_ERROR["message"]
    assert error["param"] == "tools"
    assert failed["error"] == {"code": "invalid_prompt", "message": CLIENT_ERROR["message"]}
    assert "retry" not in got.body.decode() and "server_error" not in got.body.decode()
    assert service.store.get("ann", failed["id"]) is None


def test_a_stream_the_replica_failed_by_itself_is_still_a_server_error():
    got, _ = run({"input": "x", "stream": True}, Answer(stream=chat_stream([chunk({"content": ""}, "error")])))
    assert events_of(got.body)[-1]["response"]["error"]["code"] == "server_error"


def test_a_cancelled_stream_ends_with_response_incomplete_and_status_cancelled():
    got, service = run({"input": "x", "stream": True}, Answer(stream=chat_stream([
        chunk({"content": "Once"}), chunk({"content": ""}, "abort")])))
    final = events_of(got.body)[-1]
    assert final["type"] == "response.incomplete" and final["response"]["status"] == "cancelled"
    assert final["response"]["incomplete_details"] is None


def stored_with_input(service=None):
    items = ["x", [{"role": "system", "content": "be brief"}, {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "a"}]}, {"type": "function_call_output", "call_id": "c1", "output": "42"}]]
    got, service = run({"input": items[1]}, Answer(body=json.dumps(
        {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": USAGE}).encode()), service)
    return json.loads(got.body)["id"], service


def listed(service, tenant: str, response_id: str, **params) -> dict:
    return asyncio.run(service.input_items(tenant, response_id, params))


def test_input_items_are_listed_newest_first_in_openais_list_shape():
    response_id, service = stored_with_input()
    page = listed(service, "ann", response_id)
    assert page["object"] == "list" and page["has_more"] is False
    assert [(i["type"], i.get("role")) for i in page["data"]] == [
        ("function_call_output", None), ("message", "user"), ("message", "system")]
    assert page["data"][1]["content"] == [{"type": "input_text", "text": "a"}]
    assert page["data"][2]["content"] == [{"type": "input_text", "text": "be brief"}]
    assert page["data"][0]["call_id"] == "c1" and page["data"][0]["output"] == "42"
    assert all(i["id"] for i in page["data"]) and len({i["id"] for i in page["data"]}) == 3
    assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
    types = pytest.importorskip("openai.types.responses", reason="the OpenAI client is a dev dependency")
    for item in page["data"]:
        from pydantic import TypeAdapter

        TypeAdapter(types.ResponseItem).validate_python(item)


def test_input_items_page_by_limit_order_and_after():
    response_id, service = stored_with_input()
    ids = [i["id"] for i in listed(service, "ann", response_id, order="asc")["data"]]
    first = listed(service, "ann", response_id, order="asc", limit="2")
    assert [i["id"] for i in first["data"]] == ids[:2] and first["has_more"] is True
    rest = listed(service, "ann", response_id, order="asc", limit="2", after=first["last_id"])
    assert [i["id"] for i in rest["data"]] == ids[2:] and rest["has_more"] is False
    assert [i["id"] for i in listed(service, "ann", response_id, after=ids[2])["data"]] == ids[1::-1]


@pytest.mark.parametrize(("params", "param"), [({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"),
                                               ({"limit": "two"}, "limit"), ({"order": "up"}, "order"),
                                               ({"after": "msg_nope"}, "after"), ({"limit": "9" * 5000}, "limit"),
                                               ({"limit": "\u00b2"}, "limit"), ({"limit": "\u0663"}, "limit")])
def test_bad_list_parameters_are_400s_naming_them(params, param):
    response_id, service = stored_with_input()
    with pytest.raises(ProtocolError) as e:
        listed(service, "ann", response_id, **params)
    assert e.value.status_code == 400 and e.value.param == param


def test_another_tenants_input_items_are_not_found():
    response_id, service = stored_with_input()
    for tenant, rid in (("bob", response_id), ("ann", "resp_unknown")):
        with pytest.raises(ProtocolError) as e:
            listed(service, tenant, rid)
        assert e.value.status_code == 404 and "not found" in e.value.message
