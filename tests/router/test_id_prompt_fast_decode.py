"""A completion whose prompt is token ids is decoded by a fast path (replica/openai/body.py ``_decode_id_prompt``):
whatever a client sends, the router's answer, the validated request, the token ids and every upstream body are
the ones the body decoded as a whole gives. Seeded hostile bodies, each read both ways."""

from __future__ import annotations

import asyncio
import gc
import random
import re
import sys

import msgspec
import pytest
from kvmesh.replica.openai import body as body_module
from kvmesh.replica.openai.body import decode_body
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.http.proxy import Forwarder
from kvmesh.router.http.proxy_request import ProxyRequest
from kvmesh.router.http.token_forwarding import KVMESH, TEXT, VLLM

PROMPTS = [
    b"[1, 2, 3]", b"[ 7 ]", b"[0,511]", b"[1,512]", b"[1, -1]", b"[-1, 2]", b"[1, 18446744073709551616]",
    b"[1, true]", b"[true]", b"[1, 1.0]", b"[1e2]", b"[1, 1e2]", b"[[1, 2], [3]]", b"[1, [2]]", b"[]", b'"text"',
    b'["a", "b"]', b'[1, "2"]', b"[1, null]", b"[0, -0]", b"[1,\n2\t,3 ]", b"[1, 2", b"[1, 2,]", b"null", b"{}",
    b"[1, NaN]", b"[1, 9999999999999999999999999999]", b"[3, 2.5]", b"[1, 0x10]", b"[01]",
    b"[" + b", ".join(b"%d" % i for i in range(1, 40)) + b"]", b"[511" + b", 0" * 600 + b"]",
]
"""Prompts: ids in and out of the 512-token vocabulary, what only looks like ids, text, batches, malformed JSON."""
FIELDS = [
    (b'"max_tokens"', [b"2", b'"2"', b"1.5", b"1e2", b"-1", b"null", b"true", b"0"]),
    (b'"model"', [b'"m"', b'"prompt"', b"1", b'"\\ud800"', b'"\\ud800\\udc00"', b'"\\u0070rompt"']),
    (b'"user"', [b'"\\"prompt\\": [1"', b'"u"', b'"\xff"', b'"caf\xc3\xa9"']),
    (b'"n"', [b"1", b"2", b"1.0", b"NaN", b"Infinity"]),
    (b'"stop"', [b'["x"]', b'"x"', b"[1]", b"[]"]),
    (b'"logit_bias"', [b'{"1": 1}', b'{"1": 1e400}', b'{"prompt": [1]}', b"[]"]),
    (b'"temperature"', [b"0.5", b"-0.0", b"1e-400", b'"hot"']),
    (b'"extra"', [b'{"prompt": [1, 2]}', b'{"prompt": "t"}', b"[[[[]]]]", b'"prompt"', b'{"a": {"b": [1.5e0]}}']),
    (b'"kv_transfer_params"', [b"{}", b"null"]),
    (b'"echo"', [b"true", b"false", b"1"]),
    (b'"add_special_tokens"', [b"true", b"false"]),
    (b'"priority"', [b"3", b'"high"']),
    (b'"pr\\u006fmpt"', [b'"shadow"', b"[4, 5]"]),  # "prompt" spelled with an escape
    (b'"\\ud800"', [b"1"]),
    (b'"stream"', [b"false", b'"no"']),
]
"""Other fields, each with good and hostile values (``"prompt"`` inside strings and nested objects among them)."""
WHITESPACE = [b"", b" ", b"\n", b"\t ", b"\r\n"]


def hostile_body(rng: random.Random, pad: bytes = b"") -> bytes:
    """A completion body of random fields in random order, sometimes with a second prompt, trailing garbage, deep
    nesting before it, cut short or wrapped in a list; ``pad`` goes in as one more field."""
    ws = lambda: rng.choice(WHITESPACE)  # noqa: E731
    fields = [(b'"prompt"', rng.choice(PROMPTS))] + [(key, rng.choice(values))
                                                     for key, values in rng.sample(FIELDS, rng.randint(0, 4))]
    if rng.random() < 0.2:
        fields.append((b'"prompt"', rng.choice(PROMPTS)))  # duplicate keys: the last wins
    if pad:
        fields.append((b'"padding"', pad))
    rng.shuffle(fields)
    raw = ws() + b"{" + b",".join(ws() + key + ws() + b":" + ws() + value + ws() for key, value in fields) + b"}"
    shape = rng.random()
    if shape < 0.04:
        return raw + b" trailing"
    if shape < 0.07:
        return b"[" + raw + b"]"
    if shape < 0.09:
        return raw[:-3]
    if shape < 0.11:
        return b'{"deep": ' + b"[" * 600 + b"]" * 600 + b"," + raw.strip()[1:]
    return raw + ws()


@pytest.fixture
def reader(tokenizer):
    assert tokenizer.vocab_size == 512  # the ids above are chosen around it
    runtime = RouterRuntime(RouterConfig(max_model_len=tokenizer.max_model_len), tokenizer=tokenizer)
    yield Forwarder(runtime.plane).reader
    runtime.renderer.close()


def whole_body_decode(monkeypatch) -> None:
    """Every body goes the way it went without the fast path: decoded as a whole."""
    monkeypatch.setattr(body_module, "_ID_PROMPT", re.compile(b"(?!)"))


def upstream_bodies(body, req, prompts) -> list:
    """What each kind of upstream would get (with and without the router's ids and priority), decoded."""
    return [msgspec.json.decode(ProxyRequest(body, req, prompts, False, forward).for_kind(kind, by_priority))
            for kind in (KVMESH, VLLM, TEXT) for forward in (False, True) for by_priority in (False, True)]


def read(reader, raw: bytes) -> tuple:
    """What the router makes of ``raw``: its answer when it refuses it, else the body, the request, the prompts'
    ids and the upstream bodies."""
    try:
        body, req, prompts = asyncio.run(reader.parse_prompts(raw, False))
    except ProtocolError as e:
        return "error", e.status_code, e.message, e.param
    request = ProxyRequest(body, req, prompts, False, True, size=len(raw))  # a large body's is encoded off the loop
    encoded = asyncio.run(request.encoded_for(KVMESH, True, reader.plane.renderer.run))
    return ("ok", msgspec.json.decode(msgspec.json.encode(body)), req.model_dump(), prompts,
            upstream_bodies(body, req, prompts), msgspec.json.decode(encoded))


def read_both_ways(reader, monkeypatch, bodies: list[bytes]) -> tuple[list[tuple], list[tuple]]:
    fast = [read(reader, raw) for raw in bodies]
    with monkeypatch.context() as m:
        whole_body_decode(m)
        whole = [read(reader, raw) for raw in bodies]
    return fast, whole


@pytest.mark.parametrize("raw", [
    b'{"prompt": [1, 2], "prompt": [3]}', b'{"prompt": [1, 2], "prompt": "text"}', b'{"prompt": "text", "prompt": [3]}',
    b'{"extra": {"prompt": [1]}, "prompt": "text"}', b'{"extra": {"prompt": "t"}, "prompt": [5, 6]}',
    b'{"user": "\\"prompt\\": [1", "prompt": "text"}', b'{"pr\\u006fmpt": [1], "prompt": "text"}',
    b'{"prompt": [1], "pr\\u006fmpt": "text"}', b'{"prompt": [1, 18446744073709551616]}', b'{"prompt": [1, -1]}',
    b'{"prompt": [0, -0], "max_tokens": 2}', b'{"prompt": [1, 1e2]}', b'{"prompt": [1, true]}',
    b'{"prompt": [[1], [2]]}',
    b'{"prompt": [1, 512]}', b'{"prompt": [1], "x": "\\udc00"}', b'{"prompt": [1], "x": NaN}', b'{"prompt": [1]} []',
    b'[{"prompt": [1]}]', b'{"prompt": [1], "echo": true, "max_tokens": 0}', b'{"prompt": [1], "priority": 5}',
])
def test_named_hostile_bodies_are_read_as_the_whole_body_decode_reads_them(reader, monkeypatch, raw):
    fast, whole = read_both_ways(reader, monkeypatch, [raw])
    assert fast == whole


def test_generated_hostile_bodies_are_read_as_the_whole_body_decode_reads_them(reader, monkeypatch):
    rng = random.Random(20261126)
    bodies = [hostile_body(rng) for _ in range(400)]
    fast, whole = read_both_ways(reader, monkeypatch, bodies)
    for raw, one, other in zip(bodies, fast, whole, strict=True):
        assert one == other, raw[:300]
    accepted = sum(outcome[0] == "ok" for outcome in fast)
    assert 40 < accepted < 360  # both answers are exercised, not only refusals


def test_large_bodies_read_off_the_loop_are_read_as_the_whole_body_decode_reads_them(reader, monkeypatch):
    rng = random.Random(7)
    pad = b'"' + b"a" * (body_module._INLINE_BYTES + 1000) + b'"'
    bodies = [hostile_body(rng, pad) for _ in range(40)]
    assert all(len(raw) > body_module._INLINE_BYTES for raw in bodies)
    fast, whole = read_both_ways(reader, monkeypatch, bodies)
    for raw, one, other in zip(bodies, fast, whole, strict=True):
        assert one == other, raw[:300]
    assert any(outcome[0] == "ok" for outcome in fast)


def test_the_fast_path_is_taken_for_a_plain_token_id_prompt(tokenizer, monkeypatch):
    """The differential tests above compare two paths: the fast one is really taken for a token-id prompt."""
    taken = []
    decode = body_module._decode_id_prompt
    monkeypatch.setattr(body_module, "_decode_id_prompt", lambda *a: taken.append(decode(*a)) or taken[-1])
    decode_body(b'{"prompt": [1, 2], "max_tokens": 2}', CompletionRequest, tokenizer.token_ids_type)
    assert taken and taken[0] is not None


def deepest_decoded() -> int:
    """The deepest list nesting in a body's field that ``decode_json`` takes here (the recursion limit's)."""
    def takes(depth: int) -> bool:
        try:
            decode_body(b'{"prompt": [1], "x": ' + b"[" * depth + b"]" * depth + b"}", CompletionRequest)
        except ProtocolError:
            return False
        return True
    low, high = 1, 1
    while takes(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if takes(middle) else (low, middle)
    return low


def outcome(raw: bytes, in_range) -> tuple:
    try:
        body, req, checked = decode_body(raw, CompletionRequest, in_range)
    except ProtocolError as e:
        return "error", e.status_code, e.message
    return "ok", msgspec.json.encode(body), req.model_dump(), checked


def test_nesting_at_the_recursion_limit_is_refused_or_taken_as_a_whole(tokenizer, monkeypatch):
    """The fast path decodes each field one level less deep than the whole object, but its first pass (the object
    as ``msgspec.Raw`` fields) walks every field at the whole object's depth: a field nested to the limit is refused
    with the whole decode's answer, never taken where the whole body would not be."""
    deepest = deepest_decoded()
    bodies = [b'{"prompt":[1,2],"x":' + b"[" * depth + b"]" * depth + b"}"
              for depth in range(deepest - 3, deepest + 4)]
    fast = [outcome(raw, tokenizer.token_ids_type) for raw in bodies]
    with monkeypatch.context() as m:
        whole_body_decode(m)
        whole = [outcome(raw, tokenizer.token_ids_type) for raw in bodies]
    assert fast == whole
    assert fast[0][0] == "ok" and fast[-1][:3] == ("error", 400, "request body is nested too deeply")


@pytest.mark.parametrize("filler", [b" " * (1 << 20), b'"dropped": "' + b"a" * (1 << 20) + b'", "dropped": 1,'])
def test_the_prompt_kept_as_sent_does_not_keep_the_whole_body_alive(reader, filler):
    """A request lives as long as its stream (or its wait in the queue): its prompt's bytes are its own, not a view
    of a client's megabyte of whitespace or of a field the decode dropped."""
    raw = b'{' + filler + b'"prompt": [1, 2, 3], "max_tokens": 2}'
    held = sys.getrefcount(raw)
    body, req, prompts = asyncio.run(reader.parse_prompts(raw, False))
    assert req.prompt == [1, 2, 3] and bytes(body["prompt"]) == b"[1, 2, 3]"  # the fast path's bytes as sent
    gc.collect()  # a finished loop's frames in a reference cycle may hold it until collected; body and req hold on
    assert sys.getrefcount(raw) == held
