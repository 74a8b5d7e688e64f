"""Structured outputs over HTTP, on a stories260K replica with a ChatML template and through a router in front of
it: every answer obeys its ``response_format`` / ``structured_outputs`` / ``guided_*`` field, and a constraint
that cannot be compiled is a 400 naming the field."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from . import openai_pair
from .openai_pair import AUTH, HI, KEY

pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")
jsonschema = pytest.importorskip("jsonschema", reason="the answers are checked against their schema by jsonschema")

pair = openai_pair.pair  # the fixture
SCHEMA = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "angry"]}, "ok": {"type": "boolean"}},
          "required": ["mood", "ok"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "mood", "schema": SCHEMA, "strict": True}}
DEEP = {"type": "string"}
for _ in range(70):
    DEEP = {"type": "object", "properties": {"a": DEEP}}
PROMPTS = ["hi", "tell me a story", "how are you today?", "what is the weather like"]


def chat(url: str, **fields) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers=AUTH, timeout=120,
                      json={"messages": HI, "max_tokens": 64, **fields})


def complete(url: str, **fields) -> httpx.Response:
    return httpx.post(url + "/v1/completions", headers=AUTH, timeout=120,
                      json={"prompt": "Once upon a time", "max_tokens": 64, **fields})


def answers(r: httpx.Response) -> list[tuple[str, str]]:
    assert r.status_code == 200, r.text
    return [(c["message"]["content"] if "message" in c else c["text"], c["finish_reason"]) for c in r.json()["choices"]]


def test_json_schema_answers_parse_and_match_greedy_and_sampled(pair):
    """4 prompts greedy and 16 answers at temperature 1, max_tokens 64: each is JSON matching the schema."""
    for url in pair:
        got = [a for prompt in PROMPTS for a in answers(chat(url, messages=[{"role": "user", "content": prompt}],
                                                             temperature=0, response_format=JSON_SCHEMA))]
        got += answers(chat(url, temperature=1.0, n=16, seed=7, response_format=JSON_SCHEMA))
        assert len(got) == 20
        for text, reason in got:
            jsonschema.validate(json.loads(text), SCHEMA)
            assert reason == "stop", text


def test_completions_take_response_format_too(pair):
    """A json_schema answer parses; a json_object one is an object as far as it got (a tiny model may write one
    long key until max_tokens)."""
    for url in pair:
        [(text, reason)] = answers(complete(url, temperature=0, response_format=JSON_SCHEMA))
        jsonschema.validate(json.loads(text), SCHEMA)
        [(text, reason)] = answers(complete(url, temperature=0, response_format={"type": "json_object"}))
        assert text.startswith("{") and (reason == "length" or isinstance(json.loads(text), dict))


@pytest.mark.parametrize("fields", [{"structured_outputs": {"choice": ["yes", "no"]}}, {"guided_choice": ["yes", "no"]},
                                    {"guided_grammar": 'root ::= "yes" | "no"'}])
def test_a_choice_gives_one_of_its_strings(pair, fields):
    for url in pair:
        for text, reason in answers(chat(url, temperature=1.0, n=4, seed=1, **fields)):
            assert text in ("yes", "no") and reason == "stop"


def test_a_regex_shapes_the_answer(pair):
    pattern = r"[A-Z][a-z]+ is [0-9]{2} years old\."
    for url in pair:
        for fields in ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern}):
            [(text, reason)] = answers(complete(url, temperature=0, **fields))
            assert re.fullmatch(pattern, text) and reason == "stop", text


def test_a_stream_carries_the_same_constrained_answer(pair):
    for url in pair:
        r = chat(url, temperature=0, stream=True, response_format=JSON_SCHEMA)
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        streamed = "".join(c["delta"].get("content", "") for chunk in chunks for c in chunk["choices"])
        assert streamed == answers(chat(url, temperature=0, response_format=JSON_SCHEMA))[0][0]
        jsonschema.validate(json.loads(streamed), SCHEMA)


def test_max_tokens_inside_the_grammar_ends_with_length(pair):
    for url in pair:
        [(text, reason)] = answers(chat(url, temperature=0, max_tokens=4, response_format=JSON_SCHEMA))
        assert reason == "length" and text.startswith("{")


def test_whitespace_is_left_out_unless_asked_for(pair):
    for url in pair:
        [(tight, _)] = answers(chat(url, temperature=0, structured_outputs={"json": SCHEMA}))
        [(loose, _)] = answers(chat(url, temperature=0, structured_outputs={"json": SCHEMA,
                                                                          "disable_any_whitespace": False}))
        assert "\n" not in tight and "  " not in tight
        assert isinstance(json.loads(tight), dict) and loose  # free whitespace: the model may not close it


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
        "a": {"type": 7}}}}}}, "response_format"),
    ({"structured_outputs": {"regex": "([a-z]"}}, "structured_outputs"),
    ({"guided_regex": "(yes"}, "guided_regex"),
    ({"guided_grammar": 'root ::= "a" |'}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"structured_outputs": {"choice": ["a"], "regex": "a"}}, "structured_outputs"),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"structured_outputs": {"whitespace_pattern": " *", "json_object": True}}, "structured_outputs"),
    ({"guided_json": DEEP}, "guided_json"),  # xgrammar would read it for seconds
])
def test_a_constraint_that_cannot_be_compiled_is_a_400_naming_it(pair, fields, param):
    for url in pair:
        for ask in (chat, complete):
            r = ask(url, **fields)
            assert r.status_code == 400, (url, r.text)
            error = r.json()["error"]
            assert (error.get("param") or "").startswith(param) and param in error["message"], (url, error)


def test_the_openai_client_gets_json(pair):
    openai = pytest.importorskip("openai", reason="the OpenAI Python client is not installed")
    for url in pair:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
        answer = client.chat.completions.create(model="stories", messages=HI, max_tokens=64, temperature=0,
                                                response_format=JSON_SCHEMA)
        jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMA)
        answer = client.completions.create(model="stories", prompt="Once", max_tokens=8,
                                           extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert answer.choices[0].text in ("yes", "no")


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_reports_the_compile_seconds_its_request_waited_for(pair, stream):
    """A new grammar's answer carries ``x-kvmesh-grammar-compile-s`` (a stream's headers too: they follow the
    compile); the same grammar again comes from the cache and costs nothing; a plain request has none."""
    replica, _ = pair
    words = [f"w{stream}{i}" for i in range(300)]  # a spec no other test compiles
    first = complete(replica, max_tokens=4, stream=stream, structured_outputs={"choice": words})
    assert first.status_code == 200, first.text
    assert float(first.headers["x-kvmesh-grammar-compile-s"]) > 0
    again = complete(replica, max_tokens=4, stream=stream, structured_outputs={"choice": words})
    assert again.status_code == 200 and "x-kvmesh-grammar-compile-s" not in again.headers
    assert "x-kvmesh-grammar-compile-s" not in complete(replica, max_tokens=4).headers
