"""Which body each kind of upstream gets (router/http/token_forwarding.py), without servers."""

from __future__ import annotations

import json

import msgspec
import pytest
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.router.config import TokenizeConfig
from kvmesh.router.http.proxy_request import ProxyRequest
from kvmesh.router.http.token_forwarding import KVMESH, TEXT, VLLM, upstream_kind

IDS = [[1, 400, 401, 402], [1, 500]]


def body_for(raw: dict, kind: str, prompts=IDS, enabled=True) -> dict:
    chat = "messages" in raw
    req = (ChatCompletionRequest if chat else CompletionRequest).model_validate(raw)
    prompts = prompts[:1] if chat else prompts[:len(req.prompts())]
    return json.loads(ProxyRequest(dict(raw), req, prompts, chat, enabled).for_kind(kind))


def test_kvmesh_replica_gets_completion_ids_and_keeps_every_other_field():
    raw = {"prompt": "Once upon", "cache_salt": "t1", "temperature": 0.7, "seed": 3, "stream": True,
           "return_token_ids": True, "max_tokens": 5, "frequency_penalty": 0}
    sent = body_for(raw, KVMESH)
    assert sent == {**raw, "prompt": IDS[0]}


def test_batch_of_prompts_becomes_a_batch_of_id_lists_in_order():
    assert body_for({"prompt": ["a", "b"]}, KVMESH)["prompt"] == IDS
    assert body_for({"prompt": ["a"]}, KVMESH)["prompt"] == IDS[:1]  # still a batch of one


@pytest.mark.parametrize("kind", [KVMESH, VLLM])
def test_echo_and_token_id_prompts_go_as_sent(kind):
    assert body_for({"prompt": "Once", "echo": True}, kind)["prompt"] == "Once"
    assert body_for({"prompt": [5, 6]}, kind, prompts=[[5, 6]])["prompt"] == [5, 6]


def test_vllm_gets_completion_ids_unless_it_would_tokenize_differently():
    assert body_for({"prompt": "Once"}, VLLM)["prompt"] == IDS[0]
    assert body_for({"prompt": "Once", "add_special_tokens": False}, VLLM)["prompt"] == "Once"
    assert body_for({"prompt": "Once", "truncate_prompt_tokens": 3}, VLLM)["prompt"] == "Once"
    assert body_for({"prompt": "Once", "add_special_tokens": False}, KVMESH)["prompt"] == IDS[0]  # kvmesh ignores it


def test_chat_ids_go_to_kvmesh_replicas_only():
    raw = {"messages": [{"role": "user", "content": "hi"}], "cache_salt": "t2", "seed": 9}
    assert body_for(raw, KVMESH) == {**raw, "prompt_token_ids": IDS[0]}
    assert body_for(raw, VLLM) == raw


def test_chat_ids_are_added_to_the_body_as_sent():
    raw = b'{"messages": [{"role": "user", "content": "hi \\u00e9}"}], "seed": 9}  \n'
    req = ChatCompletionRequest.model_validate(json.loads(raw))
    sent = ProxyRequest(msgspec.json.decode(raw), req, IDS[:1], True, True).for_kind(KVMESH)
    assert json.loads(sent) == {**json.loads(raw), "prompt_token_ids": IDS[0]}
    assert msgspec.json.decode(sent) == json.loads(sent)  # no duplicate keys for decoders to disagree on
    assert sent.count(b'"prompt_token_ids"') == 1


def test_chat_ids_are_the_top_level_field_when_the_name_is_nested_in_the_body():
    # A client may not send prompt_token_ids (router_only.py); the name inside another object is not the field.
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "metadata": {"prompt_token_ids": [7]}}'
    req = ChatCompletionRequest.model_validate(json.loads(raw))
    sent = msgspec.json.decode(ProxyRequest(msgspec.json.decode(raw), req, IDS[:1], True, True).for_kind(KVMESH))
    assert sent["prompt_token_ids"] == IDS[0] and sent["metadata"] == {"prompt_token_ids": [7]}


def test_vllm_tokenizing_options_are_keys_not_values():
    assert body_for({"prompt": "Once", "user": "add_special_tokens"}, VLLM)["prompt"] == IDS[0]
    assert body_for({"prompt": "Once", "metadata": {"add_special_tokens": 1}}, VLLM)["prompt"] == IDS[0]


@pytest.mark.parametrize("by_priority", [True, False])
def test_every_key_goes_once_with_what_the_router_decided(by_priority):
    # The client's duplicate keys were settled by the decoder (the last wins); the body sent names each key once.
    raw = b'{"prompt": "Once", "priority": 5, "kv_transfer_params": {"do_remote_decode": true}, "priority": 7}'
    req = CompletionRequest.model_validate(msgspec.json.decode(raw))
    request = ProxyRequest(msgspec.json.decode(raw), req, IDS[:1], False, True, priority=3)
    request.kv_transfer_params = {"do_remote_prefill": True}
    sent = request.for_kind(KVMESH, by_priority=by_priority)
    assert sent.count(b'"priority"') == int(by_priority) and sent.count(b'"kv_transfer_params"') == 1
    assert msgspec.json.decode(sent) == {"prompt": IDS[0], "kv_transfer_params": {"do_remote_prefill": True},
                                         **({"priority": 3} if by_priority else {})}


def test_unknown_fields_go_to_the_replica_unchanged():
    raw = {"prompt": "Once", "an_extension": {"a": [1, 2.5, None]}, "some_future_field": "x" * 3, "nested": {"k": {}}}
    for kind in (KVMESH, VLLM, TEXT):
        sent = body_for(raw, kind)
        assert {k: sent[k] for k in raw if k != "prompt"} == {k: v for k, v in raw.items() if k != "prompt"}


@pytest.mark.parametrize("raw", [{"prompt": "Once"}, {"messages": [{"role": "user", "content": "hi"}]}])
def test_nothing_is_rewritten_when_off_or_for_a_mismatched_tokenizer(raw):
    assert body_for(raw, KVMESH, enabled=False) == raw
    assert body_for(raw, TEXT) == raw
    assert body_for(raw, KVMESH, prompts=[]) == raw  # a router without a tokenizer has no ids


def test_streams_ask_for_token_ids_in_the_rewritten_body_too():
    raw = {"prompt": "Once", "stream": True}
    req = CompletionRequest.model_validate(raw)
    body = ProxyRequest(dict(raw), req, IDS[:1], False, True)
    body.ask_for_token_ids()
    for kind in (KVMESH, TEXT):
        assert json.loads(body.for_kind(kind))["return_token_ids"] is True


class _Tok:
    fingerprint = "abc"


@pytest.mark.parametrize("info, kind", [
    ({"version": "kvmesh", "tokenizer_fingerprint": "abc"}, KVMESH),
    ({"version": "kvmesh"}, KVMESH),
    ({"version": "kvmesh", "tokenizer_fingerprint": "other"}, TEXT),
    ({"version": "0.11.0"}, VLLM),
    (None, VLLM),
    ("not a dict", VLLM),
])
def test_upstream_kind_from_server_info(info, kind):
    assert upstream_kind(info, _Tok()) == kind


def test_an_upstream_that_is_not_kvmesh_gets_completion_ids_and_chat_as_sent(fakes, start_router, tokenizer):
    """The fake replicas say nothing in /server_info (as vLLM): text completions arrive as the router's ids
    (the fake counts a list prompt's ids, a text prompt's bytes), chat and echo as the client sent them."""
    import httpx

    from .conftest import wait_for

    router = start_router([f.spec for f in fakes])
    wait_for(lambda: sum(r.accepts is not None for r in router.runtime.replicas) == 2, what="both replicas probed")
    assert {r.accepts for r in router.runtime.replicas} == {VLLM}
    text = "Once upon a time there was a dog."

    def prompt_tokens(path, body):
        r = httpx.post(router.url + path, json={"max_tokens": 2, **body}, timeout=20)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens("/v1/completions", {"prompt": text}) == len(tokenizer.render_completion(text))
    assert prompt_tokens("/v1/completions", {"prompt": text, "echo": True}) == len(text.encode())
    messages = [{"role": "user", "content": text}]
    assert prompt_tokens("/v1/chat/completions", {"messages": messages}) == len(json.dumps(messages).encode())
    off = start_router([f.spec for f in fakes], tokenize=TokenizeConfig(forward_token_ids=False))
    wait_for(lambda: off.runtime.router.healthy, what="a replica healthy")
    r = httpx.post(off.url + "/v1/completions", json={"prompt": text, "max_tokens": 2}, timeout=20)
    assert r.json()["usage"]["prompt_tokens"] == len(text.encode())


@pytest.mark.parametrize("size, off_loop", [(1000, False), (1 << 20, True)])
def test_a_large_bodys_upstream_body_is_encoded_off_the_loop(size, off_loop):
    import asyncio

    calls = []

    async def offload(fn, *args):
        calls.append(fn)
        return fn(*args)

    raw = {"prompt": "Once", "seed": 1}
    req = CompletionRequest.model_validate(raw)
    request = ProxyRequest(dict(raw), req, IDS[:1], False, True, size=size, priority=2)
    sent = asyncio.run(request.encoded_for(KVMESH, True, offload))
    assert msgspec.json.decode(sent) == {"prompt": IDS[0], "seed": 1, "priority": 2}
    assert sent == request.for_kind(KVMESH, True) and bool(calls) == off_loop
