"""The Responses API through a router before two real replicas, with OpenAI's Python client: plain, streamed, with
function tools and a tool-output turn, with a JSON schema; a conversation continued by ``previous_response_id`` goes
to the replica holding it (its cached tokens cover the earlier turns); stored responses are their tenant's only."""

from __future__ import annotations

import json

import jsonschema
import pytest

from . import responses_cluster
from .responses_cluster import BLOCK_SIZE, TENANT_KEYS

cluster = responses_cluster.cluster  # the fixture
openai = pytest.importorskip("openai", reason="the OpenAI Python client is a dev dependency (pip install -e .[dev])")

WEATHER = {"type": "object", "properties": {"city": {"enum": ["paris", "rome"]}, "days": {"type": "integer",
           "minimum": 1, "maximum": 9}}, "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "the forecast", "parameters": WEATHER},
         {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {
             "zone": {"enum": ["utc", "cet"]}}, "required": ["zone"], "additionalProperties": False}}]
STORY = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her dog "
         "Max. One day the sun was shining and the birds were singing in the tall green trees.")


def client(router, tenant: str = "ann") -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key=TENANT_KEYS[tenant], max_retries=0, timeout=120)


def full_blocks(tokens: int) -> int:
    return tokens // BLOCK_SIZE * BLOCK_SIZE


def test_a_plain_response_answers_with_a_message_and_usage(cluster):
    router = cluster.router
    r = client(router).responses.create(model="stories", input=STORY, max_output_tokens=12, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "stories"
    assert r.status in ("completed", "incomplete")
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text == r.output[0].content[0].text and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert client(router).responses.retrieve(r.id).output_text == r.output_text


def test_a_streamed_response_sends_the_events_in_order(cluster):
    router = cluster.router
    events = list(client(router).responses.create(model="stories", input=STORY, max_output_tokens=12,
                                                  temperature=0, stream=True))
    kinds = [e.type for e in events]
    deltas = [i for i, kind in enumerate(kinds) if kind == "response.output_text.delta"]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert deltas and deltas == list(range(4, 4 + len(deltas)))
    assert kinds[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.incomplete"]  # max_output_tokens hit
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert "".join(events[i].delta for i in deltas) == final.output_text
    assert final.usage.output_tokens == 12 and final.incomplete_details.reason == "max_output_tokens"
    assert client(router).responses.retrieve(final.id).output_text == final.output_text


def test_function_tools_then_a_tool_output_turn(cluster):
    router = cluster.router
    ann = client(router)
    first = ann.responses.create(model="stories", input="weather in paris?", tools=TOOLS, tool_choice="required",
                                 parallel_tool_calls=False,
                                 max_output_tokens=96, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed"
    for call in calls:
        schema = next(t["parameters"] for t in TOOLS if t["name"] == call.name)
        jsonschema.validate(json.loads(call.arguments), schema)
    second = ann.responses.create(model="stories", previous_response_id=first.id, tools=TOOLS, tool_choice="none",
                                  input=[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"}
                                         for c in calls], max_output_tokens=8, temperature=0)
    assert second.status in ("completed", "incomplete") and second.output[0].type == "message"
    assert second.usage.input_tokens_details.cached_tokens >= full_blocks(first.usage.input_tokens)


def test_streamed_function_calls_send_their_arguments(cluster):
    router = cluster.router
    events = list(client(router).responses.create(model="stories", input="what time is it?", tools=TOOLS,
                                                  tool_choice={"type": "function", "name": "get_time"},
                                                  max_output_tokens=64, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    jsonschema.validate(json.loads(done.arguments), TOOLS[1]["parameters"])


def test_a_json_schema_constrains_the_text(cluster):
    router = cluster.router
    r = client(router).responses.create(model="stories", input="the weather as JSON", max_output_tokens=96,
                                        temperature=0, text={"format": {"type": "json_schema", "name": "weather",
                                                                        "schema": WEATHER, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), WEATHER)
    assert r.text.format.type == "json_schema"


def test_three_turns_by_previous_response_id_reuse_the_cached_conversation(cluster):
    router = cluster.router
    ann, previous, turns = client(router), None, []
    for text in (STORY, "What did Lily do next?", "And what did Max do?"):
        raw = ann.responses.with_raw_response.create(model="stories", input=text, previous_response_id=previous,
                                                     max_output_tokens=12, temperature=0,
                                                     extra_headers={"x-kvmesh-receipt": "1"})
        r = raw.parse()
        assert r.status in ("completed", "incomplete") and r.output_text
        turns.append((r, raw.headers))
        previous = r.id
    for (before, _), (after, headers) in zip(turns, turns[1:], strict=False):
        covered = full_blocks(before.usage.input_tokens)
        assert after.usage.input_tokens > before.usage.input_tokens + before.usage.output_tokens
        assert after.usage.input_tokens_details.cached_tokens >= covered
        assert int(headers["x-kvmesh-predicted-hit-tokens"]) >= covered  # the route receipt: the prefix matched
        assert headers["x-kvmesh-replica"] == turns[0][1]["x-kvmesh-replica"]


def test_a_stored_response_is_its_tenants_only(cluster):
    router = cluster.router
    ann, bob = client(router, "ann"), client(router, "bob")
    r = ann.responses.create(model="stories", input="hello", max_output_tokens=4)
    for attempt in (lambda: bob.responses.retrieve(r.id), lambda: bob.responses.delete(r.id),
                    lambda: bob.responses.create(model="stories", input="go on", previous_response_id=r.id,
                                                 max_output_tokens=4)):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert f"Response with id '{r.id}' not found." in str(refused.value)
    with pytest.raises(openai.NotFoundError):  # the same answer as for an id never stored
        bob.responses.retrieve("resp_" + "0" * 32)
    assert ann.responses.retrieve(r.id).id == r.id
    ann.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        ann.responses.retrieve(r.id)


def test_store_false_keeps_nothing(cluster):
    router = cluster.router
    r = client(router).responses.create(model="stories", input="hello", max_output_tokens=4, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client(router).responses.retrieve(r.id)


def test_a_flood_of_stored_responses_stays_within_the_tenants_bound(cluster):
    bound = 12_000
    router = cluster.start(responses_max_bytes_per_tenant=bound)
    ann, bob = client(router, "ann"), client(router, "bob")
    kept = bob.responses.create(model="stories", input="hello", max_output_tokens=2)
    ids = [ann.responses.create(model="stories", input=STORY, max_output_tokens=2).id for _ in range(30)]
    store = router.responses.store
    assert 0 < store.tenant_bytes("ann") <= bound
    assert client(router, "ann").responses.retrieve(ids[-1]).id == ids[-1]
    with pytest.raises(openai.NotFoundError):  # the least recently used went first
        ann.responses.retrieve(ids[0])
    assert bob.responses.retrieve(kept.id).id == kept.id  # another tenant's flood evicts none of bob's


def test_the_replica_serves_the_responses_api_too(cluster):
    from .responses_cluster import KEY

    replica_url = cluster.replica_urls[0]
    direct = openai.OpenAI(base_url=replica_url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    first = direct.responses.create(model="stories", input=STORY, max_output_tokens=8, temperature=0)
    second = direct.responses.create(model="stories", input="Then?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    assert second.usage.input_tokens_details.cached_tokens >= full_blocks(first.usage.input_tokens)
    assert direct.responses.retrieve(second.id).previous_response_id == first.id
