"""The router's reading of a request: a token-id prompt is range-checked once, as it is validated, with the answers
and ids the replica's two checks give."""

from __future__ import annotations

import asyncio
import json

import pytest
from kvmesh.replica.openai.body import decode_body
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.http.proxy import Forwarder


@pytest.fixture
def reader(tokenizer):
    runtime = RouterRuntime(RouterConfig(max_model_len=tokenizer.max_model_len), tokenizer=tokenizer)
    yield Forwarder(runtime.plane).reader
    runtime.renderer.close()


def parse(reader, body: dict, chat: bool = False):
    return asyncio.run(reader.parse_prompts(json.dumps(body).encode(), chat))


def test_token_ids_in_range_are_checked_as_they_are_validated_and_not_again(reader, tokenizer, monkeypatch):
    ids = [1, 5, tokenizer.vocab_size - 1, 7]

    def second_check(*_):
        raise AssertionError("the ids were range-checked twice")

    monkeypatch.setattr(type(tokenizer), "render_completion", second_check)
    body, req, prompts = parse(reader, {"prompt": ids, "max_tokens": 2})
    assert prompts == [ids] and req.prompt == ids
    assert prompts[0] is not body["prompt"]  # the body forwarded as sent is not the router's own list


@pytest.mark.parametrize("prompt, why", [
    ([1, 5, 10**6], "prompt token id 1000000 is out of range"),
    ([1, -1], "prompt token id -1 is out of range"),
])
def test_token_ids_out_of_range_get_the_replicas_answer(reader, prompt, why):
    with pytest.raises(ProtocolError) as e:
        parse(reader, {"prompt": prompt, "max_tokens": 2})
    assert e.value.status_code == 400 and e.value.message.startswith(why) and e.value.param == "prompt"


@pytest.mark.parametrize("prompt", [[1, True], [1, 2.0], [1, "2"], [[1, 2], [3]]])
def test_what_is_not_a_plain_id_list_is_validated_as_without_the_range_check(tokenizer, prompt):
    body = json.dumps({"prompt": prompt}).encode()
    try:
        plain = ("ok", decode_body(body, CompletionRequest)[1].prompt)
    except ProtocolError as e:
        plain = ("error", e.message)
    try:
        _, req, checked = decode_body(body, CompletionRequest, tokenizer.token_ids_type)
        ranged = ("ok", req.prompt)
    except ProtocolError as e:
        ranged, checked = ("error", e.message), {}
    assert ranged == plain and checked == {}


def test_an_error_before_the_range_check_keeps_its_turn(reader):
    """A bad field is the answer before out-of-range ids, as when the ids were checked only by the renderer."""
    with pytest.raises(ProtocolError) as e:
        parse(reader, {"prompt": [1, 10**6], "max_tokens": 2, "kv_transfer_params": {}})
    assert e.value.param == "kv_transfer_params"


def outcome(fn):
    try:
        return "ok", fn()
    except ProtocolError as e:
        return "error", e.status_code, e.message, e.param


@pytest.mark.parametrize("raw", [
    b'{"prompt": [1, 2], "x": NaN}', b'{"prompt": [1, 2], "x": "\xff"}', b'{"prompt": [1, 2], "x": "\\ud800"}',
    b'{"prompt": [1, 2]} trailing', b'{"prompt": [1, 2], "n": 1.5}', b'{"prompt": [1, 2], "prompt": "a"}',
    b'{"prompt": "a", "prompt": [3, 4]}', b'{"prompt": [1, 2], "max_tokens": "2"}', b'{"prompt": []}',
    b'{"prompt": [1, 99999999999999999999999]}', b'{"prompt": [1, true]}', b'{"prompt": [[1], [2]]}',
    b'{"prompt": [1, 2], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", b'[{"prompt": [1, 2]}]',
    b'{"user": "\\"prompt\\": [1", "prompt": [1, 2]}', b'{"prompt": [1, 2], "pr\\u006fmpt": "text"}',
])
def test_a_body_with_a_token_id_prompt_is_read_as_the_whole_body_decode_reads_it(tokenizer, raw):
    """Whatever the fast decode of a token-id prompt takes, the validated request and every answer are the ones
    the object decoded as a whole gives."""
    fast = outcome(lambda: decode_body(raw, CompletionRequest, tokenizer.token_ids_type)[1])
    whole = outcome(lambda: decode_body(raw, CompletionRequest)[1])
    assert fast == whole


def test_the_prompt_of_token_ids_goes_upstream_as_sent(reader):
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.http.token_forwarding import KVMESH

    raw = b'{"model": "m", "prompt": [1,  5 , 9], "max_tokens": 2, "extra": {"a": [1.5e0]}}'
    body, req, prompts = asyncio.run(reader.parse_prompts(raw, False))
    assert prompts == [[1, 5, 9]] and req.prompt == [1, 5, 9]
    sent = ProxyRequest(body, req, prompts, False, True).for_kind(KVMESH, by_priority=True)
    assert b'"prompt":[1,  5 , 9]' in sent  # its bytes as the client wrote them, not re-encoded
    assert json.loads(sent) == {**json.loads(raw), "priority": 0}
