"""Router and replica are one OpenAI front: the same body gets the same status and error shape from both.

A real replica (stories260K) and a router in front of it, both with an API key, the same chat
template and the same limits (replica/openai/ serves both).
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from kvmesh.replica.serving.tokenizer import NO_CHAT_TEMPLATE, load_tokenizer
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.router_server import RouterServer

from . import openai_pair
from .leaving_client import post_unread
from .openai_pair import AUTH, HI

pair = openai_pair.pair  # the fixture

def both(pair, path: str, body: bytes | str, headers=AUTH) -> tuple[httpx.Response, httpx.Response]:
    content = body.encode() if isinstance(body, str) else body
    return tuple(httpx.post(url + path, content=content, headers=headers, timeout=60) for url in pair)


def error_shape(r: httpx.Response) -> tuple:
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    return r.status_code, err["type"], err["code"], err["param"]


VALID = [
    ("/tokenize", {"prompt": "Once upon a time"}),
    ("/tokenize", {"prompt": "Once upon a time", "add_special_tokens": False}),
    ("/tokenize", {"messages": HI}),
    ("/tokenize", {"messages": HI, "add_special_tokens": True}),
    ("/tokenize", {"messages": HI, "add_generation_prompt": False}),
    ("/v1/completions/render", {"prompt": ["Once upon", "a time"], "max_tokens": 3, "temperature": 0.5}),
    ("/v1/completions/render", {"prompt": [1, 403, 407], "cache_salt": "t1"}),
    ("/v1/chat/completions/render", {"messages": HI, "max_tokens": 2, "stream": True}),
]


@pytest.mark.parametrize("path, body", VALID)
def test_same_answer_for_valid_bodies(pair, path, body):
    replica, router = both(pair, path, json.dumps(body))
    assert replica.status_code == router.status_code == 200, (replica.text, router.text)

    def strip_ids(x):
        items = x if isinstance(x, list) else [x]
        return [{k: v for k, v in item.items() if k != "request_id"} for item in items]

    assert strip_ids(replica.json()) == strip_ids(router.json())


def test_tokenize_messages_with_special_tokens_adds_them_on_both(pair):
    replica, router = both(pair, "/tokenize", json.dumps({"messages": HI, "add_special_tokens": True}))
    plain, _ = both(pair, "/tokenize", json.dumps({"messages": HI}))
    assert replica.json()["tokens"] == router.json()["tokens"] == [1] + plain.json()["tokens"]  # BOS added again


DEEP = "[" * 1200 + "]" * 1200
INVALID = [
    ("/tokenize", {"prompt": "hi", "messages": HI}),  # both
    ("/tokenize", {}),  # neither
    ("/tokenize", {"prompt": 5}),
    ("/v1/completions", "{not json"),
    ("/v1/completions", "[1, 2]"),
    ("/v1/completions", {"max_tokens": 3}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}),
    ("/v1/completions", '{"prompt": "hi", "temperature": NaN}'),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}),
    ("/v1/completions", {"prompt": "hi", "n": 0}),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"five": 1}}),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"100000": 1}}),  # outside the vocabulary
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}),
    ("/v1/completions", {"prompt": "hi", "best_of": 2, "stream": True}),
    ("/v1/completions", {"prompt": ["hi", [1] * 600]}),  # the second prompt is over the context
    ("/v1/chat/completions", {"messages": HI, "top_logprobs": 3}),  # without logprobs: true
    ("/v1/completions", {"prompt": [1, 2**32]}),
    ("/v1/completions", {"prompt": [1, -3]}),
    ("/v1/completions", {"prompt": [1, 100000]}),
    ("/v1/completions", {"prompt": "x" * 5000}),  # over max_prompt_chars
    ("/v1/completions", '{"prompt": "bad \\ud800 surrogate"}'),
    ("/v1/completions", '{"prompt": ' + DEEP + "}"),
    ("/v1/completions", "{\"prompt\": \"hi\", \"stop\": " + "[" * 900 + "]" * 900 + "}"),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": HI, "chat_template": "{{ messages }}"}),  # untrusted
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/v1/chat/completions/render", {"messages": HI, "tools": [{"type": "function"}]}),
    ("/v1/responses", {"input": "hi", "background": True}),
    ("/v1/responses", {"input": [{"type": "web_search_call", "id": "w"}]}),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "file_search"}]}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 100000}),  # over the context: the chat's 400, renamed
    ("/v1/responses", {"input": "hi", "model": "gpt-9"}),
    ("/v1/responses", {"input": "hi", "previous_response_id": "resp_never_stored"}),
    ("/v1/responses", {"input": "x" * 5000}),  # over max_prompt_chars
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "n", "schema": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}}),
    ("/v1/nothing", {}),
]


@pytest.mark.parametrize("path, body", INVALID)
def test_same_status_and_error_shape_for_invalid_bodies(pair, path, body):
    raw = body if isinstance(body, str) else json.dumps(body)
    replica, router = both(pair, path, raw)
    assert 400 <= replica.status_code < 500, replica.text
    assert error_shape(replica) == error_shape(router), (replica.text, router.text)
    assert replica.json() == router.json()  # the same words too: one implementation answers


def test_the_routers_priority_is_its_own_and_an_fcfs_replica_gets_none(pair):
    # A replica under fcfs refuses a non-zero priority (vLLM's rule); through the router the priority is the one
    # admission granted (README "Overload"), sent only to a replica that schedules by it.
    replica, router = both(pair, "/v1/completions", json.dumps({"prompt": "hi", "priority": 3, "max_tokens": 1}))
    assert replica.status_code == 400 and "priority" in replica.json()["error"]["message"], replica.text
    assert router.status_code == 200, router.text


MISTYPED = [  # vLLM answers 400; lax parsing would take "2" for 2 and "yes" for true
    ("/v1/completions", {"prompt": "hi", "n": "2"}, "n"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "4"}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "priority": "1"}, "priority"),
    ("/v1/chat/completions", {"messages": HI, "stream": 1}, "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "alien", "content": "hi"}]}, "messages.0.role"),
    ("/v1/responses", {"input": "hi", "store": "yes"}, "store"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": "4"}, "max_output_tokens"),
]


@pytest.mark.parametrize("path, body, field", MISTYPED)
def test_a_mistyped_field_is_a_400_naming_it_on_both(pair, path, body, field):
    replica, router = both(pair, path, json.dumps(body))
    assert replica.status_code == router.status_code == 400, (replica.text, router.text)
    assert replica.json() == router.json()
    assert replica.json()["error"]["message"].startswith(f"invalid request: {field}: "), replica.text


def test_both_refuse_missing_or_wrong_keys_the_same_way(pair):
    for headers in ({}, {"Authorization": "Bearer nope"}):
        for path in ("/v1/completions", "/tokenize", "/v1/chat/completions/render", "/v1/responses"):
            replica, router = both(pair, path, json.dumps({"prompt": "hi"}), headers=headers)
            assert error_shape(replica) == error_shape(router) == (401, "authentication_error", 401, None)


def test_bodies_over_the_limit_are_413_before_they_are_read(pair):
    body = json.dumps({"prompt": "x" * (2 << 20)})
    replica, router = both(pair, "/v1/completions", body)
    assert error_shape(replica) == error_shape(router) == (413, "invalid_request_error", 413, None)


@pytest.mark.parametrize("path", ["/ping", "/version", "/get_load"])
def test_probe_endpoints_answer_without_a_key_on_both(pair, path):
    for url in pair:
        assert httpx.get(url + path, timeout=10).status_code == 200, (url, path)
    replica, router = (httpx.get(url + "/version").json() for url in pair)
    assert replica == router and replica["version"]


def test_get_load_has_sglangs_shape(pair):
    for url in pair:
        rows = httpx.get(url + "/get_load", timeout=10).json()
        assert {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"} <= set(rows[0])


def test_render_answers_vllms_generate_request_shape(pair):
    replica, _ = both(pair, "/v1/completions/render", json.dumps({"prompt": ["Once upon", "a time"],
                                                                 "max_tokens": 3}))
    items = replica.json()
    assert len(items) == 2 and all(item["request_id"].startswith("cmpl-") for item in items)
    assert items[0]["token_ids"][0] == 1 and items[0]["sampling_params"]["max_tokens"] == 3
    assert items[0]["model"] == "stories" and items[0]["token_offsets"] is None
    chat, _ = both(pair, "/v1/chat/completions/render", json.dumps({"messages": HI}))
    assert chat.json()["request_id"].startswith("chatcmpl-") and chat.json()["token_ids"][0] == 1


def test_a_routed_chat_equals_the_replicas_own(pair):
    body = json.dumps({"messages": HI, "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    replica, router = both(pair, "/v1/chat/completions", body)
    assert replica.status_code == router.status_code == 200
    assert replica.json()["choices"] == router.json()["choices"]
    assert replica.json()["usage"]["prompt_tokens"] == router.json()["usage"]["prompt_tokens"]


def test_a_routed_batch_with_logprobs_equals_the_replicas_own(pair):
    body = json.dumps({"prompt": ["Once upon a time", "The little dog"], "n": 2, "max_tokens": 3, "temperature": 0,
                       "logprobs": 2, "echo": True, "logit_bias": {"29": 5}})
    replica, router = both(pair, "/v1/completions", body)
    assert replica.status_code == router.status_code == 200, (replica.text, router.text)
    mine, routed = replica.json()["choices"], router.json()["choices"]
    assert [c["index"] for c in mine] == [c["index"] for c in routed] == [0, 1, 2, 3]
    for a, b in zip(mine, routed, strict=True):
        assert (a["text"], a["logprobs"]["tokens"]) == (b["text"], b["logprobs"]["tokens"])
        assert a["logprobs"]["token_logprobs"][0] is None  # echo: nothing predicts the first prompt token
        assert a["logprobs"]["token_logprobs"][1:] == pytest.approx(b["logprobs"]["token_logprobs"][1:], abs=1e-4)
    assert replica.json()["usage"] == router.json()["usage"]


def test_model_without_a_chat_template_refuses_chat_like_vllm(stories_path):
    bare = load_tokenizer(stories_path)
    router = RouterServer(RouterConfig(port=0), [], tokenizer=bare).start()
    try:
        for path in ("/v1/chat/completions", "/v1/chat/completions/render"):
            r = httpx.post(router.url + path, json={"messages": HI}, timeout=10)
            assert r.status_code == 400 and r.json()["error"]["message"] == NO_CHAT_TEMPLATE
            assert "--chat-template" in NO_CHAT_TEMPLATE  # says what to do
            tools = [{"type": "function", "function": {"name": "f"}}]
            r = httpx.post(router.url + path, json={"messages": HI, "tools": tools}, timeout=10)
            # tools ask for tool_choice "auto", which needs flags this router lacks: that 400 first
            assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
        assert httpx.post(router.url + "/v1/completions/render", json={"prompt": "hi"}).status_code == 200
    finally:
        router.stop()


def test_both_close_connections_that_never_finish_their_request_head(pair):
    socks = []
    for url in pair:
        host, port = url.removeprefix("http://").split(":")
        for _ in range(5):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            socks.append(sock)
    for sock in socks:
        assert sock.recv(1024) == b""  # EOF: the server closed it (after header_timeout_s = 1 s)
        sock.close()


def _replica_counter(replica_url: str, name: str, label: str = "") -> float:
    text = httpx.get(replica_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line)


def test_abandoned_non_streaming_requests_through_the_router_are_aborted_on_the_replica(pair):
    replica_url, router_url = pair
    aborted = _replica_counter(replica_url, "vllm:request_success_total", 'finished_reason="abort"')
    generated = _replica_counter(replica_url, "vllm:generation_tokens_total")
    body = {"prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True}
    for _ in range(3):  # each client leaves once its request runs on the replica, not before it got there
        with post_unread(router_url, "/v1/completions", body, AUTH):
            running = time.monotonic() + 20
            while _replica_counter(replica_url, "vllm:num_requests_running") < 1 and time.monotonic() < running:
                time.sleep(0.02)
            assert _replica_counter(replica_url, "vllm:num_requests_running") >= 1, "the request never ran"
        gone = time.monotonic() + 20  # the replica aborted it before the next one is sent
        while _replica_counter(replica_url, "vllm:num_requests_running") > 0 and time.monotonic() < gone:
            time.sleep(0.02)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and \
            _replica_counter(replica_url, "vllm:request_success_total", 'finished_reason="abort"') < aborted + 3:
        time.sleep(0.1)
    assert _replica_counter(replica_url, "vllm:request_success_total", 'finished_reason="abort"') == aborted + 3
    assert _replica_counter(replica_url, "vllm:generation_tokens_total") - generated < 3 * 500


def test_a_responses_error_names_the_responses_field_on_both(pair):
    for body, param in (({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens"),
                        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0"),
                        ({"input": "hi", "previous_response_id": "resp_x"}, "previous_response_id")):
        replica, router = both(pair, "/v1/responses", json.dumps(body))
        assert replica.json() == router.json() and replica.json()["error"]["param"] == param, replica.text
