"""``/v1/responses`` attacked in its own shape: function tools whose parameters are hostile JSON schemas (each of
field_attacks.py's ``SCHEMAS``, the call forced by name and by "required"), tool_choice, ``text.format`` with each
schema, input items, and previous response ids that are malformed. Each body asks for 4 tokens of stories260K.

The chat-shaped ``tools`` and ``tool_choice`` of field_attacks.py are refused on shape on this endpoint; these reach
the grammar: a schema a tool carries is the one its forced call is constrained to.
"""

from __future__ import annotations

import json

from .field_attacks import SCHEMAS, WORDS
from .hostile_values import HUGE_CHARS, HUGE_ITEMS
from .shots import Shot, post

NEST = 900
"""Nesting a body may have that the decoder still takes (it refuses past about a thousand, so the 10,000-deep
values of hostile_values.py never reach a field)."""


def _body(fields: str) -> bytes:
    return ('{"input": "Tell me a story", "max_output_tokens": 4, ' + fields + "}").encode()


def _tool(params: str, name: str = '"f"') -> str:
    return f'{{"type": "function", "name": {name}, "parameters": {params}}}'


def _tools() -> list[Shot]:
    named = '"tool_choice": {"type": "function", "name": "f"}'
    out = []
    for s in SCHEMAS:
        out.append(post(f"tools: a named tool's parameters: {s.label}",
                        lambda s=s: _body(f'"tools": [{_tool(s.text())}], {named}')))
    for s in SCHEMAS[:4]:  # the ones a grammar compile refuses or a limit stops, with the call forced another way
        out.append(post(f"tools: required, parameters {s.label}",
                        lambda s=s: _body(f'"tools": [{_tool(s.text())}], "tool_choice": "required"')))
    out.append(post("tools: strict, parameters its own $ref", _body(
        '"tools": [{"type": "function", "name": "f", "strict": true, "parameters": {"$ref": "#"}}], ' + named)))
    words = [f"w{i}" for i in range(WORDS)]
    out += [
        post(f"tools: {WORDS:,} tools, required", lambda: _body('"tool_choice": "required", "tools": ' + json.dumps(
            [{"type": "function", "name": w, "parameters": {"type": "object"}} for w in words]))),
        post("tools: a huge description", lambda: _body('"tools": [{"type": "function", "name": "f", "description": '
                                                        f'"{"d" * HUGE_CHARS}"}}], {named}')),
        post("tools: a huge name", lambda: _body(f'"tools": [{_tool("{}", json.dumps("n" * HUGE_CHARS))}]')),
        post("tools: two tools of one name", _body(f'"tools": [{_tool("{}")}, {_tool("{}")}], {named}')),
        post("tools: a built-in tool", _body('"tools": [{"type": "web_search"}]')),
        post("tools: a chat-shaped tool", _body('"tools": [{"type": "function", "function": {"name": "f"}}]')),
        post("tools: parameters a list", _body(f'"tools": [{_tool("[]")}], {named}')),
        post("tools: a type nested 900 deep", _body('"tools": [{"type": ' + "[" * NEST + "]" * NEST + "}]")),
        post("tools: no list", _body('"tools": {"type": "function", "name": "f"}')),
    ]
    return out


def _tool_choice() -> list[Shot]:
    tool = f'"tools": [{_tool("{}")}]'
    return [post(f"tool_choice: {label}", _body(f"{tool}, \"tool_choice\": {choice}")) for label, choice in (
        ("a tool that is not there", '{"type": "function", "name": "g"}'), ("no name", '{"type": "function"}'),
        ("chat-shaped", '{"type": "function", "function": {"name": "f"}}'),
        ("allowed_tools", '{"type": "allowed_tools", "mode": "required", "tools": []}'),
        ("a name nested 900 deep", '{"type": "function", "name": ' + "[" * NEST + "]" * NEST + "}"),
        ("a huge name", '{"type": "function", "name": "' + "g" * HUGE_CHARS + '"}'),
        ("an unknown mode", '"sometimes"'), ("a number", "1"))] + [
        post("tool_choice: required, no tools", _body('"tool_choice": "required"')),
        post("tool_choice: named, no tools", _body('"tool_choice": {"type": "function", "name": "f"}'))]


def _text_format() -> list[Shot]:
    out = [post(f"text.format json_schema: {s.label}", lambda s=s: _body(
        '"text": {"format": {"type": "json_schema", "name": "n", "strict": true, "schema": ' + s.text() + "}}"))
        for s in SCHEMAS]
    return out + [post(f"text.format: {label}", _body(f'"text": {{"format": {fmt}}}')) for label, fmt in (
        ("json_schema without a schema", '{"type": "json_schema", "name": "n"}'),
        ("a schema that is a list", '{"type": "json_schema", "name": "n", "schema": []}'),
        ("strict a string", '{"type": "json_schema", "name": "n", "strict": "yes", "schema": {}}'),
        ("a huge name", '{"type": "json_schema", "name": "' + "n" * HUGE_CHARS + '", "schema": {}}'),
        ("chat-shaped", '{"type": "json_schema", "json_schema": {"name": "n", "schema": {}}}'),
        ("json_object", '{"type": "json_object"}'), ("grammar", '{"type": "grammar", "grammar": "root ::= root"}'),
        ("a type nested 900 deep", '{"type": ' + "[" * NEST + "]" * NEST + "}"))] + [
        post("text.format with a forced call", _body(f'"tools": [{_tool("{}")}], "tool_choice": "required", "text": '
                                                     '{"format": {"type": "json_schema", "name": "n", "schema": '
                                                     '{"$ref": "#"}}}'))]


def _input(items: str) -> bytes:
    return ('{"max_output_tokens": 4, "input": ' + items + "}").encode()


CALL = '{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}'
INPUT_ITEMS = (
    ("a call's output 900 deep", f'[{CALL}, {{"type": "function_call_output", "call_id": "c", "output": '
                                 + "[" * NEST + "]" * NEST + "}]"),
    ("a call's output an object", f'[{CALL}, {{"type": "function_call_output", "call_id": "c", "output": {{}}}}]'),
    ("an output with no call", '[{"type": "function_call_output", "call_id": "nope", "output": "x"}]'),
    ("a call with arguments not JSON", '[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]'),
    ("a call with no name", '[{"type": "function_call", "call_id": "c", "arguments": "{}"}]'),
    ("an item_reference", '[{"type": "item_reference", "id": "msg_0123"}]'),
    ("an image part", '[{"role": "user", "content": [{"type": "input_image", "image_url": "http://127.0.0.1:9/"}]}]'),
    ("a file part", '[{"role": "user", "content": [{"type": "input_file", "file_id": "file-0"}]}]'),
    ("the role tool", '[{"type": "message", "role": "tool", "content": "x"}]'),
    ("a role nested", '[{"role": {"role": "system"}, "content": "x"}]'),
    ("a reasoning item alone", '[{"type": "reasoning", "summary": [], "encrypted_content": "x"}]'),
    ("a text part with no text", '[{"role": "user", "content": [{"type": "input_text"}]}]'),
    ("an empty list", "[]"), ("a number", "7"), ("an empty string", '""'),
    ("a system message only", '[{"role": "system", "content": "You obey."}]'),
)


def _input_items() -> list[Shot]:
    many = [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 10}] * (HUGE_ITEMS // 10)
    return [post(f"input: {label}", _input(items)) for label, items in INPUT_ITEMS] + [
        post(f"input: {HUGE_ITEMS // 10:,} messages of 10 parts", lambda: _input(json.dumps(many))),
        post(f"input: {HUGE_ITEMS:,} calls", lambda: _input(json.dumps([json.loads(CALL)] * HUGE_ITEMS)))]


MALFORMED_IDS = ("", "resp_\u0000", "r\u00e9sp_\u00e9", "a" * 128, "a" * 129, "resp_?x=1", "../../v1/models",
                 "resp_%2F..%2F", "\ud800")


def _previous_ids() -> list[Shot]:
    out = [post(f"previous_response_id: {json.dumps(i)[:24]} ({len(i)} characters)", {
        "input": "hi", "max_output_tokens": 4, "previous_response_id": i}) for i in MALFORMED_IDS]
    return out + [post(f"previous_response_id: {label}", _body(f'"previous_response_id": {v}')) for label, v in (
        ("a number", "5"), ("a list", '["resp_0"]'), ("nested 900 deep", "[" * NEST + "]" * NEST))]


def responses_shots() -> list[Shot]:
    """Every attack of the module doc."""
    return [*_tools(), *_tool_choice(), *_text_format(), *_input_items(), *_previous_ids()]

