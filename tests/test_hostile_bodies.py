"""Generated hostile bodies against the router and a replica: every answer is a 4xx or a success, never a 5xx.

Hypothesis builds bodies from the request schemas with hostile values in every field (lone
surrogates, ids >= 2^32 / negative / past the vocabulary, NaN, deep nesting, wrong types, raw
bytes), for every endpoint that reads a body, including the router's admin ``POST /replicas``.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import openai_pair
from .openai_pair import AUTH

pair = openai_pair.pair  # the fixture

ADMIN = {"Authorization": "Bearer admin-key", "content-type": "application/json"}
PATHS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/completions/render",
         "/v1/chat/completions/render"]

nasty_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["\ud800", "a\udfff b", "\x00", "{{ 7*7 }}", "{% for x in range(10**9) %}{% endfor %}", ""]),
)
nasty_int = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([2**32, 2**32 - 1, -1, 512, 100000, 2**63]))
nasty_float = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-1.0, 0.0, 2.5]))


def nested(depth: int):
    return st.just(json.loads("[" * depth + "]" * depth))


scalar = st.one_of(st.none(), st.booleans(), nasty_int, nasty_float, nasty_text)
anything = st.recursive(scalar, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                        max_leaves=12)
prompt = st.one_of(nasty_text, st.lists(nasty_int, max_size=8), st.lists(nasty_text, max_size=3),
                   st.lists(st.lists(nasty_int, max_size=4), max_size=3), anything, nested(50))
message = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), anything),
                                 "content": st.one_of(nasty_text, anything,
                                                      st.lists(st.fixed_dictionaries({"type": nasty_text,
                                                                                      "text": anything})))})
fields = {
    "model": st.one_of(st.none(), st.just("stories"), nasty_text),
    "max_tokens": st.one_of(st.integers(-2, 4), nasty_int, anything),  # never None: keep generation short
    "temperature": st.one_of(nasty_float, anything),
    "top_p": nasty_float, "top_k": nasty_int, "seed": nasty_int, "n": nasty_int, "min_tokens": nasty_int,
    "stop": st.one_of(nasty_text, st.lists(nasty_text, max_size=3), anything),
    "stop_token_ids": st.one_of(st.lists(nasty_int, max_size=3), anything),
    "stream": st.booleans(), "stream_options": anything, "cache_salt": st.one_of(nasty_text, anything),
    "logit_bias": anything, "logprobs": anything, "echo": anything, "chat_template": nasty_text,
    "add_special_tokens": anything, "add_generation_prompt": anything, "tools": anything,
    "response_format": anything,
}
request_body = st.fixed_dictionaries(
    {"max_tokens": fields["max_tokens"]},
    optional={"prompt": prompt, "messages": st.one_of(st.lists(message, max_size=3), anything),
              **{k: v for k, v in fields.items() if k != "max_tokens"}},
)
registration = st.fixed_dictionaries({}, optional={"url": st.one_of(nasty_text, anything, st.just("http://x:1")),
                                                   "events": anything, "replay": anything, "id": anything,
                                                   "extra": anything})


def encode(body) -> bytes:
    return json.dumps(body, ensure_ascii=True, allow_nan=True).encode()  # lone surrogates as \\ud800 escapes


raw_body = st.one_of(
    request_body.map(encode),
    anything.map(encode),
    st.binary(max_size=64),
    st.integers(600, 3000).map(lambda d: b'{"prompt": ' + b"[" * d + b"]" * d + b"}"),
    st.integers(600, 3000).map(lambda d: b'{"messages": ' + b"{\"a\":" * d + b"1" + b"}" * d + b"}"),
)

BASES = {  # a valid body per path; ``one_bad_field`` replaces one of its fields with a hostile value
    "/v1/completions": {"prompt": [1, 403, 407], "max_tokens": 2},
    "/v1/completions/render": {"prompt": "Once upon a time", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/chat/completions/render": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/tokenize": {"prompt": "Once upon a time"},
}
hostile_value = {**fields, "prompt": prompt, "messages": st.one_of(st.lists(message, max_size=3), anything)}


@pytest.fixture(scope="module")
def fresh_client():
    """A new connection per request, as a client per request would open, from one client built once: building an
    ``httpx.Client`` (its TLS context) costs ~60 ms of CPU, more than most of these requests."""
    with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


def one_bad_field(path: str):
    """A valid body with one field replaced (often still valid: then the engine serves it)."""
    keys = sorted(hostile_value)
    return st.sampled_from(keys).flatmap(
        lambda k: hostile_value[k].map(lambda v: encode({**BASES[path], k: v})))


@settings(max_examples=320, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS + ["/replicas"]), data=st.data(), registration=registration.map(encode),
       stream=st.booleans())
def test_no_hostile_body_gets_a_5xx(pair, fresh_client, path, data, registration, stream):
    replica_url, router_url = pair
    body = b"" if path == "/replicas" else data.draw(st.one_of(raw_body, one_bad_field(path)))
    targets = [(router_url, ADMIN, registration)] if path == "/replicas" else \
        [(replica_url, AUTH, body), (router_url, AUTH, body)]
    for url, headers, content in targets:
        if stream:
            with fresh_client.stream("POST", url + path, content=content, headers=headers) as r:
                text = r.read().decode("utf-8", "replace")
        else:
            r = fresh_client.post(url + path, content=content, headers=headers)
            text = r.text
        assert r.status_code < 500, (url + path, content[:300], text[:500])
        assert '"code":5' not in text.replace(" ", ""), (url + path, content[:300], text[:500])  # not in a stream
        if r.status_code >= 400:
            assert r.json()["error"]["code"] == r.status_code


def test_the_generated_bodies_reach_past_validation(pair):
    """The generator is not all noise: a plain generated-shape body is served (so the test above exercises
    the tokenizer and the engine too, not only the JSON parser)."""
    replica_url, router_url = pair
    body = encode({"max_tokens": 2, "prompt": [1, 2, 3], "stop": ["\ud800"]})
    for url in pair:
        r = httpx.post(url + "/v1/completions", content=body, headers=AUTH, timeout=60)
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]  # lone surrogate refused
    ok = encode({"max_tokens": 2, "prompt": [1, 2, 3], "stop": ["x"]})
    assert all(httpx.post(u + "/v1/completions", content=ok, headers=AUTH, timeout=60).status_code == 200
               for u in (replica_url, router_url))


pytestmark = pytest.mark.slow
