"""How much grammar one request may ask for: the sizes of what the replica compiles (a regex, a grammar, a JSON
schema, a ``choice`` list, the tools' parameters), checked where the request is decoded, router and replica alike,
so a request over them is a 400 naming the field and the limit before xgrammar reads any of it or the router
sends it on (compile time grows with these sizes: a 40,000-word choice list compiles for half a minute).

    regex, grammar, JSON schema (compact JSON), choice strings together   <= FrontendConfig.max_grammar_chars
    tools' parameters together (what "required" / a named tool compiles)  <= max_grammar_chars
    strings in a choice list                                              <= max_choices
    levels of objects and arrays a schema (or a tool's parameters) nests  <= max_schema_depth
    tools                                                                 <= max_tools

Values of the wrong type are left to the fields' own checks (a 400 of their own).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.openai.tool_fields import ToolFields
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.structured_outputs import json_depth

if TYPE_CHECKING:
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest

_SO_KINDS = ("json", "regex", "grammar", "choice")
"""``structured_outputs`` keys whose value is compiled."""


def check_grammar_limits(req: CompletionRequest | ChatCompletionRequest, config: FrontendConfig) -> None:
    """A ProtocolError(400) naming the first field over its limit (module doc)."""
    for field, kind, value in _constraints(req) if req.sends_constraint else ():
        if kind == "choice":
            _check_choice(field, value, config)
        elif kind == "json":
            _check_schema(field, value, config)
        else:
            _check_chars(field, len(value), config)
    if isinstance(req, ToolFields) and isinstance(req.tools, list):  # chat requests
        _check_tools(req.tools, config)


def _constraints(req: CompletionRequest | ChatCompletionRequest) -> Iterator[tuple[str, str, object]]:
    """(field, kind, value) of every constraint the request sends, whatever its shape."""
    so = req.structured_outputs
    if isinstance(so, dict):
        for kind in _SO_KINDS:
            if so.get(kind) is not None:
                yield f"structured_outputs.{kind}", kind, so[kind]
    rf = req.response_format
    spec = rf.get("json_schema") if isinstance(rf, dict) else None
    if isinstance(spec, dict) and spec.get("schema") is not None:
        yield "response_format.json_schema.schema", "json", spec["schema"]
    for field, kind, value in (("guided_json", "json", req.guided_json), ("guided_regex", "regex", req.guided_regex),
                               ("guided_choice", "choice", req.guided_choice),
                               ("guided_grammar", "grammar", req.guided_grammar)):
        if value is not None:
            yield field, kind, value


def _check_chars(field: str, chars: int, config: FrontendConfig) -> None:
    if chars > config.max_grammar_chars:
        raise ProtocolError(f"{field} has {chars} characters; the limit is {config.max_grammar_chars} "
                            "(max_grammar_chars)", param=field)


def _check_choice(field: str, choice: object, config: FrontendConfig) -> None:
    if not isinstance(choice, list):
        return
    if len(choice) > config.max_choices:
        raise ProtocolError(f"{field} has {len(choice)} strings; the limit is {config.max_choices} (max_choices)",
                            param=field)
    _check_chars(field, sum(len(c) for c in choice if isinstance(c, str)), config)


def _check_schema(field: str, schema: object, config: FrontendConfig) -> None:
    """A schema's size as compact JSON, then its depth (a schema sent as JSON text is read for it)."""
    if isinstance(schema, str):
        _check_chars(field, len(schema), config)
        try:
            schema = msgspec.json.decode(schema)
        except (msgspec.DecodeError, RecursionError):
            return  # not JSON: from_schema says so
    elif isinstance(schema, dict):
        _check_chars(field, len(msgspec.json.encode(schema)), config)
    _check_depth(field, schema, config)


def _check_depth(field: str, schema: object, config: FrontendConfig) -> None:
    if (depth := json_depth(schema)) > config.max_schema_depth:
        raise ProtocolError(f"{field} nests {depth} levels deep; the limit is {config.max_schema_depth} "
                            "(max_schema_depth)", param=field)


def _check_tools(tools: list, config: FrontendConfig) -> None:
    if len(tools) > config.max_tools:
        raise ProtocolError(f"tools has {len(tools)} tools; the limit is {config.max_tools} (max_tools)",
                            param="tools")
    chars = 0
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        if isinstance(parameters, dict):
            chars += len(msgspec.json.encode(parameters))
            _check_chars("tools", chars, config)
            _check_depth(f"tools[{i}].function.parameters", parameters, config)
