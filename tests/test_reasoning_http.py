"""Reasoning output through the router and on the replica (stories260K, a chat template that writes ``<think>`` into
the prompt as DeepSeek-R1's does): ``reasoning_content`` and ``content`` split as vLLM splits them, whole and
streamed; ``include_reasoning``; structured outputs that constrain the answer after the reasoning.

stories260K writes no ``</think>`` of its own, so the answers that end their reasoning are forced by a regex on a
server that constrains the reasoning too (vLLM's ``enable_in_reasoning``)."""

from __future__ import annotations

import json

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .openai_pair import AUTH, KEY
from .reasoning_chat_template import THINKING_TEMPLATE
from .vllm_field_probes import events, refused

ASK = [{"role": "user", "content": "Tell me a story."}]
REASONING, ANSWER = "Once upon a time, there was a girl.", "\n\nShe was happy."
FORCED = {"regex": (REASONING + "</think>" + ANSWER).replace(".", r"\.").replace(",", r"\,")}
SCHEMA = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}}, "required": ["mood"],
          "additionalProperties": False}


def replica(stories_path, frontend: FrontendConfig, **server) -> ReplicaRuntime:
    return ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8),
                                ReplicaServerConfig(port=0, api_key=KEY, served_model_name="stories", **server),
                                frontend=frontend)


@pytest.fixture(scope="module")
def servers(stories_path):
    """(replica URL, router URL), both with ``--reasoning-parser deepseek_r1``, constraints in the reasoning and
    ``--tool-call-parser hermes``."""
    frontend = FrontendConfig(chat_template=THINKING_TEMPLATE, reasoning_parser="deepseek_r1", enable_in_reasoning=True,
                              enable_auto_tool_choice=True, tool_call_parser="hermes")
    one = replica(stories_path, frontend, event_port=0, replay_port=0)
    at = one.endpoints()
    router = RouterServer(RouterConfig(port=0, api_key=KEY, admin_key="admin-key", served_model_name="stories",
                                       frontend=frontend, upstream=UpstreamConfig(poll_interval_s=0.2,
                                                                                  replica_api_key=KEY)),
                          [ReplicaSpec(one.http.url, at["events_endpoint"], at["replay_endpoint"], replica_id="r0")],
                          tokenizer=load_tokenizer(stories_path, chat_template=THINKING_TEMPLATE)).start()
    try:
        yield one.http.url, router.url
    finally:
        router.stop()
        one.shutdown(graceful_s=1)


@pytest.fixture(scope="module")
def qwen3_replica(stories_path):
    """A replica with ``--reasoning-parser qwen3`` whose constraints wait for the end of the reasoning (vLLM's
    default)."""
    frontend = FrontendConfig(chat_template=THINKING_TEMPLATE, reasoning_parser="qwen3")
    one = replica(stories_path, frontend, event_port=None)
    try:
        yield one.http.url
    finally:
        one.shutdown(graceful_s=1)


def chat(url: str, **fields) -> httpx.Response:
    body = {"messages": ASK, "max_tokens": 48, "temperature": 0, **fields}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)


def message(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def streamed(r: httpx.Response) -> tuple[str, str, list[dict]]:
    """(reasoning, content) joined from the deltas, and the deltas."""
    deltas = [c["choices"][0]["delta"] for c in events(r) if c["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert reasoning == "".join(d.get("reasoning") or "" for d in deltas)
    return reasoning, "".join(d.get("content") or "" for d in deltas), deltas


def test_reasoning_and_content_split_as_vllm_splits_them_whole_and_streamed(servers):
    for url in servers:
        whole = message(chat(url, structured_outputs=FORCED))
        assert (whole["reasoning_content"], whole["content"]) == (REASONING, ANSWER)
        assert whole["reasoning"] == REASONING  # vLLM's newer name
        reasoning, content, deltas = streamed(chat(url, structured_outputs=FORCED, stream=True))
        assert (reasoning, content) == (REASONING, ANSWER)
        assert not any("think>" in (d.get("content") or "") + (d.get("reasoning_content") or "") for d in deltas)
        assert sum(bool(d.get("reasoning_content")) for d in deltas) > 1 and sum(bool(d.get("content"))
                                                                                for d in deltas) > 1


def test_an_answer_that_never_ends_its_reasoning_is_all_reasoning(servers):
    for url in servers:
        whole = message(chat(url, max_tokens=12))
        assert whole["content"] is None and whole["reasoning_content"]
        reasoning, content, _ = streamed(chat(url, max_tokens=12, stream=True))
        assert (reasoning, content) == (whole["reasoning_content"], "")


def test_include_reasoning_false_leaves_the_reasoning_and_its_tokens_out(servers):
    for url in servers:
        whole = message(chat(url, structured_outputs=FORCED, include_reasoning=False))
        assert whole["content"] == ANSWER and "reasoning_content" not in whole and "reasoning" not in whole
        r = chat(url, structured_outputs=FORCED, include_reasoning=False, logprobs=True)
        assert r.json()["choices"][0]["logprobs"] is None, r.text
        reasoning, content, deltas = streamed(chat(url, structured_outputs=FORCED, include_reasoning=False,
                                                   stream=True, logprobs=True))
        assert (reasoning, content) == ("", ANSWER)
        assert all(c["choices"][0]["logprobs"] is None for c in events(chat(
            url, structured_outputs=FORCED, include_reasoning=False, stream=True, logprobs=True)) if c["choices"])


@pytest.mark.parametrize("bad", ["no", 0, None, [], {"x": 1}])
def test_include_reasoning_of_the_wrong_type_is_a_400_naming_it(servers, bad):
    for url in servers:
        assert refused(chat(url, include_reasoning=bad), "include_reasoning")


def test_the_openai_client_reads_the_reasoning(servers):
    openai = pytest.importorskip("openai", reason="the OpenAI Python client is not installed")
    for url in servers:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
        answer = client.chat.completions.create(model="stories", messages=ASK, max_tokens=48, temperature=0,
                                                extra_body={"structured_outputs": FORCED})
        assert answer.choices[0].message.reasoning_content == REASONING
        assert answer.choices[0].message.content == ANSWER


def test_a_constraint_waits_for_the_end_of_the_reasoning(qwen3_replica):
    free = message(chat(qwen3_replica, max_tokens=16))
    constrained = message(chat(qwen3_replica, max_tokens=16, response_format={
        "type": "json_schema", "json_schema": {"name": "m", "schema": SCHEMA}}))
    assert constrained == free and free["content"] is None  # the reasoning is not masked; it never ended
    assert "{" not in free["reasoning_content"]


@pytest.mark.parametrize("off", [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}])
def test_with_thinking_off_the_answer_is_content_and_constrained_from_the_start(qwen3_replica, off):
    fmt = {"type": "json_schema", "json_schema": {"name": "m", "schema": SCHEMA}}
    whole = message(chat(qwen3_replica, response_format=fmt, **off))
    assert json.loads(whole["content"])["mood"] in ("happy", "sad") and "reasoning_content" not in whole
    reasoning, content, _ = streamed(chat(qwen3_replica, response_format=fmt, stream=True, **off))
    assert (reasoning, content) == ("", whole["content"])


def test_a_forced_tool_call_is_the_answer_after_the_reasoning(qwen3_replica):
    tools = [{"type": "function", "function": {"name": "set_mood", "parameters": SCHEMA}}]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    called = chat(qwen3_replica, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=160,
                  **off).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls" and called["message"]["tool_calls"][0]["function"]["name"] == \
        "set_mood"
    thinking = chat(qwen3_replica, tools=tools, tool_choice="required", max_tokens=12).json()["choices"][0]
    assert thinking["finish_reason"] == "length" and "tool_calls" not in thinking["message"]
    assert thinking["message"]["reasoning_content"] and thinking["message"]["content"] is None


@pytest.mark.parametrize(("turn", "thinking"), [
    ({"reasoning_content": "I was asked."}, "I was asked."), ({"reasoning": "I was asked."}, "I was asked."),
    ({"reasoning": "newer", "reasoning_content": "older"}, "newer")])
def test_an_earlier_turns_reasoning_sent_back_reaches_the_template(servers, turn, thinking):
    turns = [*ASK, {"role": "assistant", "content": "A story.", **turn}, {"role": "user", "content": "Another."}]
    for url in servers:
        r = httpx.post(url + "/v1/chat/completions/render", json={"messages": turns}, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        text = httpx.post(url + "/detokenize", json={"tokens": r.json()["token_ids"]}, headers=AUTH,
                          timeout=60).json()["prompt"]
        assert f"<|im_start|>assistant\n<think>{thinking}</think>A story.<|im_end|>" in text


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_an_earlier_turns_reasoning_of_the_wrong_type_is_a_400_naming_it(servers, field):
    turns = [*ASK, {"role": "assistant", "content": "A story.", field: 5}, {"role": "user", "content": "Another."}]
    for url in servers:
        r = chat(url, messages=turns)
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


def test_an_earlier_turns_reasoning_counts_toward_the_prompts_characters(servers):
    turns = [*ASK, {"role": "assistant", "content": "A story.", "reasoning": "x" * (1 << 20)},
             {"role": "user", "content": "Another."}]
    for url in servers:
        r = chat(url, messages=turns)
        assert refused(r, "messages") and "characters" in r.json()["error"]["message"], r.text[:300]


def test_tool_calls_are_read_from_the_answer_after_the_reasoning_whole_and_streamed(servers):
    tools = [{"type": "function", "function": {"name": "set_mood", "parameters": SCHEMA}}]
    text = 'I will call.</think><tool_call>\n{"name": "set_mood", "arguments": {"mood": "happy"}}\n</tool_call>'
    forced = {"regex": "".join("\\" + c if c in "{}." else c for c in text)}
    for url in servers:
        choice = chat(url, tools=tools, structured_outputs=forced, max_tokens=160).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        message = choice["message"]
        assert message["reasoning_content"] == "I will call." and message["content"] is None
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
            ("set_mood", {"mood": "happy"})]
        chunks = events(chat(url, tools=tools, structured_outputs=forced, max_tokens=160, stream=True))
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == "I will call."
        calls = [call for d in deltas for call in d.get("tool_calls") or []]
        assert calls[0]["function"]["name"] == "set_mood"
        assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"mood": "happy"}
        assert not "".join(d.get("content") or "" for d in deltas).strip()
