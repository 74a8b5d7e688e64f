"""Tool calls through the router and on the replica (stories260K, a ChatML template with tools, the hermes parser):
tool_choice required / named / auto / none, whole and streamed, the chat template's tools and tool turns, and the
400s for tools that are not valid."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .openai_pair import AUTH, KEY
from .tool_chat_template import CHATML_TOOLS_TEMPLATE
from .vllm_field_probes import events, refused

FRONTEND = FrontendConfig(chat_template=CHATML_TOOLS_TEMPLATE, enable_auto_tool_choice=True,
                          tool_call_parser="hermes")
WEATHER = {"type": "object", "properties": {"city": {"enum": ["paris", "rome"]}, "days": {"type": "integer",
           "minimum": 1, "maximum": 9}}, "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function",
          "function": {"name": "get_weather", "description": "the forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "weather in paris?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "rome", "days": 3}}\n</tool_call>'


@pytest.fixture(scope="module")
def servers(stories_path):
    """(replica URL, router URL), both with the tools template and ``--enable-auto-tool-choice --tool-call-parser
    hermes``."""
    replica = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8),
                                   ReplicaServerConfig(port=0, event_port=0, replay_port=0, api_key=KEY,
                                                       served_model_name="stories"), frontend=FRONTEND)
    events_at = replica.endpoints()
    spec = ReplicaSpec(replica.http.url, events_at["events_endpoint"], events_at["replay_endpoint"], replica_id="r0")
    router = RouterServer(RouterConfig(port=0, api_key=KEY, admin_key="admin-key", served_model_name="stories",
                                       frontend=FRONTEND, upstream=UpstreamConfig(poll_interval_s=0.2,
                                                                                  replica_api_key=KEY)),
                          [spec], tokenizer=load_tokenizer(stories_path, chat_template=CHATML_TOOLS_TEMPLATE)).start()
    try:
        yield replica.http.url, router.url
    finally:
        router.stop()
        replica.shutdown(graceful_s=1)


def chat(url: str, **fields) -> httpx.Response:
    body = {"messages": ASK, "max_tokens": 96, "temperature": 0, "tools": TOOLS, **fields}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)


def answered(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def assert_valid_calls(calls: list[dict]) -> None:
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[call["function"]["name"]])


def test_required_answers_with_tool_calls_valid_for_their_parameters(servers):
    for url in servers:
        choice = answered(chat(url, tool_choice="required", parallel_tool_calls=False))
        assert choice["finish_reason"] == "tool_calls"
        assert_valid_calls(choice["message"]["tool_calls"])


def test_required_may_call_several_times(servers):
    # stories260K repeats calls until its budget: the calls whole by then are the answer
    for url in servers:
        choice = answered(chat(url, tool_choice="required", max_tokens=300))
        assert len(choice["message"]["tool_calls"]) > 1
        assert_valid_calls(choice["message"]["tool_calls"])


def test_a_named_function_is_called_with_valid_arguments(servers):
    for url in servers:
        choice = answered(chat(url, tool_choice={"type": "function", "function": {"name": "get_time"}}))
        calls = choice["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["get_time"]
        assert_valid_calls(calls)
        assert choice["finish_reason"] == "stop"  # vLLM's and OpenAI's answer to a named function


def streamed_calls(r: httpx.Response) -> tuple[dict[int, list[str]], str | None]:
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in events(r):
        for choice in chunk["choices"]:
            finish = choice["finish_reason"] or finish
            for delta in choice["delta"].get("tool_calls") or []:
                if "id" in delta:
                    calls[delta["index"]] = [delta["function"]["name"], delta["function"]["arguments"]]
                else:
                    calls[delta["index"]][1] += delta["function"]["arguments"]
    return calls, finish


def test_streamed_required_calls_join_to_valid_arguments_and_match_the_whole_answer(servers):
    for url in servers:
        calls, finish = streamed_calls(chat(url, tool_choice="required", parallel_tool_calls=False, stream=True))
        whole = answered(chat(url, tool_choice="required", parallel_tool_calls=False))["message"]["tool_calls"]
        assert finish == "tool_calls"
        assert [tuple(calls[i]) for i in sorted(calls)] == [(c["function"]["name"], c["function"]["arguments"])
                                                            for c in whole]


def test_auto_reads_hermes_calls_out_of_the_text(servers):
    # the text is forced into hermes' format, as a model trained on it would write it
    forced = {"regex": HERMES_CALL.replace("{", r"\{").replace("}", r"\}")}
    for url in servers:
        choice = answered(chat(url, tool_choice="auto", structured_outputs=forced))
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in choice["message"]["tool_calls"]] == [("get_weather", {"city": "rome", "days": 3})]
        calls, finish = streamed_calls(chat(url, structured_outputs=forced, stream=True))
        assert finish == "tool_calls" and json.loads(calls[0][1]) == {"city": "rome", "days": 3}


def test_auto_text_without_a_call_is_content(servers):
    for url in servers:
        choice = answered(chat(url, max_tokens=8))
        assert choice["message"]["content"] and "tool_calls" not in choice["message"]
        assert choice["finish_reason"] in ("stop", "length")


def test_none_answers_in_text(servers):
    for url in servers:
        choice = answered(chat(url, tool_choice="none", max_tokens=8))
        assert "tool_calls" not in choice["message"]


def test_the_template_gets_the_tools_and_renders_tool_turns_alike_on_router_and_replica(servers):
    turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "paris", "days": 1}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    rendered = []
    for url in servers:
        r = httpx.post(url + "/v1/chat/completions/render", json={"messages": turns, "tools": TOOLS,
                                                                  "tool_choice": "none"}, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        ids = r.json()["token_ids"]
        rendered.append(ids)
        text = httpx.post(url + "/detokenize", json={"tokens": ids}, headers=AUTH, timeout=60).json()["prompt"]
        assert "<tools>get_weather get_time </tools>" in text
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris", "days": 1}}\n</tool_call>' in text
        assert "<tool_response>\nsunny\n</tool_response>" in text
    assert rendered[0] == rendered[1]
    for url in servers:  # /tokenize renders the tools as the chat does
        tokenized = httpx.post(url + "/tokenize", json={"messages": turns, "tools": TOOLS}, headers=AUTH, timeout=60)
        assert tokenized.json()["tokens"] == rendered[0], tokenized.text
        bad = httpx.post(url + "/tokenize", json={"messages": turns, "tools": [{"function": {}}]}, headers=AUTH,
                         timeout=60)
        assert refused(bad, "tools.0.function.name"), bad.text


@pytest.mark.parametrize("tools, param", [
    ([{"type": "function", "function": {"parameters": WEATHER}}], "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "a string"}}], "tools.0.function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "thing"}}}], "tools.0.function.parameters"),
    ([{"type": "retrieval"}], "tools.0.type"),
    (["get_weather"], "tools.0"),
])
def test_tools_that_are_not_valid_are_a_400_naming_the_part(servers, tools, param):
    for url in servers:
        r = chat(url, tools=tools, tool_choice="none")
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tool_choice": "required", "parallel_tool_calls": "no"}, "parallel_tool_calls"),
])
def test_a_tool_choice_that_cannot_be_served_is_a_400_naming_it(servers, fields, param):
    for url in servers:
        assert refused(chat(url, **fields), param), (url, fields)


def test_parallel_tool_calls_false_allows_one_call(servers):
    for url in servers:
        one = answered(chat(url, tool_choice="required", parallel_tool_calls=False, max_tokens=300))
        assert len(one["message"]["tool_calls"]) == 1


def test_the_openai_client_reads_the_tool_calls(servers):
    openai = pytest.importorskip("openai", reason="the OpenAI Python client is not installed")
    for url in servers:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
        answer = client.chat.completions.create(model="stories", messages=ASK, tools=TOOLS, tool_choice="required",
                                                parallel_tool_calls=False, max_tokens=96, temperature=0)
        call = answer.choices[0].message.tool_calls[0]
        assert call.type == "function" and call.function.name in PARAMETERS
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
        assert answer.choices[0].finish_reason == "tool_calls"


@pytest.fixture(scope="module")
def llama3_replica(stories_path):
    """A replica reading calls with ``--tool-call-parser llama3_json``."""
    frontend = FrontendConfig(chat_template=CHATML_TOOLS_TEMPLATE, enable_auto_tool_choice=True,
                              tool_call_parser="llama3_json")
    replica = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=4),
                                   ReplicaServerConfig(port=0, event_port=None, api_key=KEY,
                                                       served_model_name="stories"), frontend=frontend)
    try:
        yield replica.http.url
    finally:
        replica.shutdown(graceful_s=1)


def test_auto_reads_llama3_json_calls_out_of_the_text(llama3_replica):
    call = '{"name": "get_time", "parameters": {"zone": "utc"}}'
    forced = {"regex": call.replace("{", r"\{").replace("}", r"\}")}
    choice = answered(chat(llama3_replica, structured_outputs=forced))
    assert choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]
            ] == [("get_time", {"zone": "utc"})]
    calls, finish = streamed_calls(chat(llama3_replica, structured_outputs=forced, stream=True))
    assert finish == "tool_calls" and calls[0][0] == "get_time" and json.loads(calls[0][1]) == {"zone": "utc"}
