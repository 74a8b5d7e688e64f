"""Cheap inputs a client can send that the engine cannot serve: each must end as the request's error (a 4xx naming
the field, or a stream's ``finish_reason: "error"``), never as a replica's 500. Shared by the replica/router pair
test (tests/test_client_errors_http.py) and the live two-replica test (tests/security/test_client_errors_live.py).

Each entry: (name, "chat" or "completions", the request's fields, the field a 400 names).
"""

from __future__ import annotations

SELF_REF = {"$ref": "#"}
"""A schema whose only rule is itself: no JSON value matches it."""
TOOL = {"type": "function", "function": {"name": "f", "parameters": SELF_REF}}

CLIENT_ERRORS: list[tuple[str, str, dict, str]] = [
    ("schema_self_ref", "chat",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SELF_REF}}},
     "response_format"),
    ("schema_recursive_defs", "completions",
     {"structured_outputs": {"json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}},
     "structured_outputs.json"),
    ("grammar_root_is_root", "completions", {"structured_outputs": {"grammar": "root ::= root"}}, "structured_outputs"),
    ("regex_matches_nothing", "completions", {"guided_regex": "[^\\x00-\\U0010FFFF]"}, "guided_regex"),
    ("choice_with_min_tokens", "completions", {"structured_outputs": {"choice": ["a", "b"]}, "min_tokens": 5},
     "min_tokens"),
    ("grammar_only_eos_with_min_tokens", "completions",
     {"structured_outputs": {"grammar": 'root ::= ""'}, "min_tokens": 3}, "min_tokens"),
    ("regex_outside_allowed_token_ids", "completions",
     {"structured_outputs": {"regex": "[0-9]+"}, "allowed_token_ids": [1, 2, 3]}, "allowed_token_ids"),
    ("named_tool_self_ref", "chat",
     {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools"),
    ("tool_choice_names_a_missing_tool", "chat",
     {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("schema_empty_enum", "completions", {"structured_outputs": {"json": {"enum": []}}}, "structured_outputs.json"),
    ("schema_minimum_above_maximum", "completions",
     {"guided_json": {"type": "integer", "minimum": 5, "maximum": 1}}, "guided_json"),
    ("schema_unresolvable_ref", "completions", {"guided_json": {"$ref": "#/nope"}}, "guided_json"),
    ("stop_token_id_outside_the_vocabulary_with_min_tokens", "completions",
     {"stop_token_ids": [10 ** 9], "min_tokens": 1}, "stop_token_ids"),
    ("choice_n_with_min_tokens", "completions",
     {"guided_choice": ["a"], "n": 3, "min_tokens": 4}, "min_tokens"),
]

HI = [{"role": "user", "content": "hi"}]


def body(kind: str, fields: dict, stream: bool) -> dict:
    """The request's JSON body (a short prompt, 16 tokens at most)."""
    prompt = {"messages": HI} if kind == "chat" else {"prompt": "Once upon"}
    return {**prompt, "max_tokens": 16, **fields, "stream": stream}


def path(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def ended_as_the_requests_error(status: int, text: str, stream: bool, param: str) -> str | None:
    """None when the answer is the request's error (a 4xx naming ``param``, or a stream whose choice ends with
    ``finish_reason: "error"`` or whose error event is a 4xx naming it); else what is wrong with it."""
    import json

    if status != 200:
        if not 400 <= status < 500:
            return f"HTTP {status}: {text[:300]}"
        error = json.loads(text)["error"]
        return None if (error.get("param") or "").startswith(param) else f"a {status} naming {error.get('param')}"
    if not stream:
        return f"HTTP 200 without an error: {text[:300]}"
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    if any("error" in e and e["error"]["code"] >= 500 for e in events):
        return f"a stream with a 5xx error event: {text[-300:]}"
    if any("error" in e and (e["error"].get("param") or "").startswith(param) for e in events):
        return None
    reasons = [c.get("finish_reason") for e in events for c in e.get("choices") or []]
    return None if "error" in reasons else f"a stream ending with {[r for r in reasons if r]}"
