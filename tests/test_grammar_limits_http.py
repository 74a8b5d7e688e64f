"""Hostile: a request asking for a huge grammar (a 40,000-word choice list compiles for half a minute). Over
FrontendConfig's limits it is a 400 naming the field and the limit, from the router (before any replica sees it)
and from the replica, while requests within them still compile and answer."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.replica.openai.config import FrontendConfig

from . import openai_pair
from .openai_pair import AUTH

pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")

pair = openai_pair.pair  # the fixture
LIMITS = FrontendConfig()
WORDS = [f"w{i}" for i in range(LIMITS.max_choices + 1)]
LONG = "a" * (LIMITS.max_grammar_chars + 1)
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(LIMITS.max_grammar_chars // 20)}}
DEEP: dict = {"type": "string"}
for _ in range(LIMITS.max_schema_depth // 2 + 1):
    DEEP = {"type": "object", "properties": {"a": DEEP}}


def tool(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


CASES = [
    ({"structured_outputs": {"choice": WORDS}}, "structured_outputs.choice", "max_choices"),
    ({"guided_choice": WORDS}, "guided_choice", "max_choices"),
    ({"guided_choice": ["x" * 40_000, "y" * 40_000]}, "guided_choice", "max_grammar_chars"),
    ({"structured_outputs": {"regex": LONG}}, "structured_outputs.regex", "max_grammar_chars"),
    ({"guided_regex": LONG}, "guided_regex", "max_grammar_chars"),
    ({"guided_grammar": f'root ::= "{LONG}"'}, "guided_grammar", "max_grammar_chars"),
    ({"structured_outputs": {"grammar": f'root ::= "{LONG}"'}}, "structured_outputs.grammar", "max_grammar_chars"),
    ({"guided_json": WIDE}, "guided_json", "max_grammar_chars"),
    ({"structured_outputs": {"json": WIDE}}, "structured_outputs.json", "max_grammar_chars"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": WIDE}}},
     "response_format.json_schema.schema", "max_grammar_chars"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP}}},
     "response_format.json_schema.schema", "max_schema_depth"),
]
CHAT_CASES = [
    ({"tools": [tool(f"f{i}") for i in range(LIMITS.max_tools + 1)]}, "tools", "max_tools"),
    ({"tools": [tool("a", WIDE)], "tool_choice": "required"}, "tools", "max_grammar_chars"),
    ({"tools": [tool("a"), tool("b", DEEP)]}, "tools[1].function.parameters", "max_schema_depth"),
]


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, headers=AUTH, timeout=60, json={"max_tokens": 4, **body})


def refused(r: httpx.Response, param: str, limit: str) -> None:
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"] and limit in error["message"], error
    assert str(getattr(LIMITS, limit)) in error["message"], error


@pytest.mark.parametrize("fields, param, limit", CASES)
def test_a_constraint_over_its_limit_is_a_400_naming_field_and_limit(pair, fields, param, limit):
    for url in pair:
        refused(post(url, "/v1/completions", {"prompt": "hi", **fields}), param, limit)
        refused(post(url, "/v1/chat/completions", {"messages": openai_pair.HI, **fields}), param, limit)


@pytest.mark.parametrize("fields, param, limit", CHAT_CASES)
def test_tools_over_their_limits_are_a_400(pair, fields, param, limit):
    for url in pair:
        refused(post(url, "/v1/chat/completions", {"messages": openai_pair.HI, **fields}), param, limit)


def test_constraints_at_their_limits_are_served(pair):
    """The largest choice list allowed compiles and answers with one of its strings."""
    words = WORDS[:LIMITS.max_choices]
    for url in pair:
        r = post(url, "/v1/completions", {"prompt": "Once", "structured_outputs": {"choice": words}})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["choices"][0]["text"] in words


def completions_seen(replica_url: str) -> float:
    """Completion requests the replica has answered, whatever their status (its /metrics)."""
    text = httpx.get(replica_url + "/metrics", headers=AUTH, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kvmesh_http_requests_total{") and "completions" in line)


def test_the_router_refuses_before_the_replica_sees_it(pair):
    replica, router = pair
    before = completions_seen(replica)
    refused(post(router, "/v1/completions", {"prompt": "hi", "guided_choice": WORDS}), "guided_choice", "max_choices")
    assert completions_seen(replica) == before
    refused(post(replica, "/v1/completions", {"prompt": "hi", "guided_choice": WORDS}), "guided_choice", "max_choices")
    assert completions_seen(replica) == before + 1  # the count can move
