"""The attacks a field's meaning allows, beyond its type's values (hostile_values.py): ``SPECIFIC``, by field name.

Work a value makes a replica do (a regex with a catastrophic backtrack, a schema that refers to itself, a grammar
whose rule is itself, 40,000 choices, a sampling parameter that overflows the logits) and values that are hostile
only with another field (``also``: a choice with ``min_tokens``, a regex with ``allowed_token_ids`` it cannot
spell). The plain request these go into asks for 4 tokens of stories260K.
"""

from __future__ import annotations

from .hostile_values import DEPTH, HUGE_CHARS, HUGE_ITEMS, Hostile, lazy, value

WORDS = 40_000
"""Choices in a huge choice list, alternatives in a huge regex or grammar, items in a huge enum."""
SCHEMA_DEPTH = 1_000
"""Nesting of a deep JSON schema (``properties`` in ``properties``)."""


def _words() -> list[str]:
    return [f"word{i}" for i in range(WORDS)]


def _deep_schema() -> str:
    """``properties`` in ``properties`` ``SCHEMA_DEPTH`` deep, as JSON text (past json.dumps' recursion limit)."""
    return '{"type": "object", "required": ["a"], "properties": {"a": ' * SCHEMA_DEPTH + '{"type": "string"}' + \
        "}}" * SCHEMA_DEPTH


SELF_REF = {"$ref": "#"}
SCHEMAS = (
    value("a schema that is its own $ref", SELF_REF),
    value("$defs that refer to each other", {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
                                                                          "b": {"$ref": "#/$defs/a"}}}),
    Hostile(f"a schema {SCHEMA_DEPTH:,} objects deep", _deep_schema),
    lazy(f"an enum of {WORDS:,}", lambda: {"enum": _words()}),
    value("a catastrophic pattern", {"type": "string", "pattern": "^(a+)+$"}),
    value("minItems 10**9", {"type": "array", "items": {"type": "integer"}, "minItems": 10**9}),
    value("minLength 10**9", {"type": "string", "minLength": 10**9}),
    value("a remote $ref", {"$ref": "http://127.0.0.1:9/schema.json"}),
    value("an unknown type", {"type": "integer-ish"}),
    value("an impossible schema", {"type": "integer", "minimum": 5, "maximum": 1}),
)
"""JSON schemas a constrained request may carry."""
REGEXES = (
    value("(a+)+$", "(a+)+$"), value("(a|aa)*c", "(a|aa)*c"), value("((a*)*)*b", "((a*)*)*b"),
    value("a{1000000}", "a{1000000}"), value("(.*){1000}", "(.*){1000}"), value("an unclosed class", "[a-"),
    value("a lookahead", "(?=a)a"), value("x{2,1}", "x{2,1}"), value("\\p{L}+", "\\p{L}+"),
    lazy(f"parentheses {DEPTH:,} deep", lambda: "(" * DEPTH + "a" + ")" * DEPTH),
    lazy(f"{WORDS:,} alternatives", lambda: "|".join(_words())),
    value("a regex allowed_token_ids cannot spell", "[a-z]+", allowed_token_ids=[1]),
)
GRAMMARS = (
    value("root ::= root", "root ::= root"), value("a rule that is only itself, twice", "root ::= a\na ::= a a"),
    value("an empty grammar", ""), value("not EBNF", "root = ("),
    value("a grammar that allows only EOS, with min_tokens", 'root ::= ""', min_tokens=3),
    lazy(f"{WORDS:,} alternatives", lambda: "root ::= " + " | ".join(f'"{w}"' for w in _words())),
    lazy(f"parentheses {DEPTH:,} deep", lambda: "root ::= " + "(" * DEPTH + '"a"' + ")" * DEPTH),
    value("left recursion", 'root ::= root "a" | "a"'),
)
CHOICES = (
    lazy(f"{WORDS:,} choices", _words), value("an empty choice", [""]), value("no choices", []),
    lazy("a huge choice", lambda: ["a" * 1_100_000]), value("choices with min_tokens", ["yes", "no"], min_tokens=5),
)


def _structured(key: str, hostile: Hostile) -> Hostile:
    return Hostile(f"{key}: {hostile.label}", lambda: f'{{"{key}": {hostile.text()}}}', hostile.also)


def _response_format(hostile: Hostile) -> Hostile:
    return Hostile(f"json_schema: {hostile.label}", lambda: '{"type": "json_schema", "json_schema": {"name": "x", '
                   f'"schema": {hostile.text()}}}}}', hostile.also)


def _tools(hostile: Hostile) -> Hostile:
    """A named tool whose parameters are ``hostile`` (the output is constrained to them)."""
    tool = '{{"type": "function", "function": {{"name": "f", "parameters": {}}}}}'
    return Hostile(f"a named tool's parameters: {hostile.label}", lambda: f"[{tool.format(hostile.text())}]",
                   (("tool_choice", {"type": "function", "function": {"name": "f"}}),))


_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SPECIFIC: dict[str, tuple[Hostile, ...]] = {
    "prompt": (lazy("128 prompts of 200 tokens", lambda: [[1] * 200] * 128), value("129 prompts", ["a"] * 129),
               value("token id 2**31", [2**31]), value("a token past the vocabulary", [10**6]),
               value("an empty prompt in a batch", [[1], []])),
    "messages": (lazy(f"{HUGE_ITEMS:,} messages", lambda: [{"role": "user", "content": "hi"}] * HUGE_ITEMS),
                 value("no messages", [])),
    "messages.role": (value("an unknown role", "root"),),
    "messages.content": (lazy(f"{HUGE_ITEMS:,} parts", lambda: [{"type": "text", "text": "a"}] * HUGE_ITEMS),
                         value("an image part", [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/"}}])),
    "messages.tool_calls": (lazy("a call with huge arguments", lambda: [{"id": "c", "type": "function", "function": {
                                "name": "f", "arguments": "[" * DEPTH + "]" * DEPTH}}]),
                            value("a call with no function", [{"id": "c", "type": "function"}])),
    "max_tokens": (value("10**9", 10**9), value("0", 0)),
    "n": (value("128", 128), value("129", 129)),
    "best_of": (value("128", 128),),
    "logprobs": (value("20 with echo", 20, echo=True), value("21", 21)),
    "top_logprobs": (value("20", 20, logprobs=True),),
    "prompt_logprobs": (value("20", 20),),
    "min_tokens": (value("10**9", 10**9), value("over max_tokens", 100)),
    "seed": (value("2**64-1", 2**64 - 1), value("-2**63", -2**63)),
    "priority": (value("the best priority", -(2**31 - 1)),),
    "temperature": (value("1e-30", 1e-30), value("1e30", 1e30), value("negative", -1.0)),
    "top_p": (value("1e-30", 1e-30), value("0", 0.0)),
    "min_p": (value("1", 1.0), value("1e-30", 1e-30)),
    "repetition_penalty": (value("1e-30", 1e-30), value("1e30", 1e30), value("0", 0.0)),
    "presence_penalty": (value("1e30", 1e30),),
    "frequency_penalty": (value("-1e30", -1e30),),
    "logit_bias": (value("1e308 on a token", {"1": 1e308}), value("a negative id", {"-1": 1.0}),
                   value("an id past the vocabulary", {"99999999": 100.0}), value("a word key", {"abc": 1.0}),
                   lazy("-100 on every token", lambda: {str(i): -100.0 for i in range(512)}),
                   lazy(f"{HUGE_ITEMS:,} ids", lambda: {str(i): 1.0 for i in range(HUGE_ITEMS)})),
    "stop": (lazy(f"{HUGE_ITEMS:,} stop strings", lambda: [f"s{i}" for i in range(HUGE_ITEMS)]),
             value("an empty stop", [""])),
    "stop_token_ids": (value("2**31", [2**31]), value("a negative id", [-1]),
                       lazy(f"{HUGE_ITEMS:,} ids", lambda: list(range(HUGE_ITEMS)))),
    "allowed_token_ids": (value("none allowed", []), value("a token past the vocabulary", [10**6]),
                          lazy(f"{HUGE_ITEMS:,} ids", lambda: list(range(HUGE_ITEMS)))),
    "truncate_prompt_tokens": (value("10**9", 10**9), value("0", 0)),
    "stream_interval": (value("10**9 streamed", 10**9, stream=True),),
    "request_id": tuple(value(f"an id four requests share ({i})", "noisy-shared-id") for i in range(4)),
    "guided_regex": REGEXES,
    "guided_grammar": GRAMMARS,
    "guided_choice": CHOICES,
    "guided_json": SCHEMAS + (value("a string that is not JSON", "{not json"),),
    "structured_outputs": (*(_structured("json", s) for s in SCHEMAS[:4]),
                           *(_structured("regex", r) for r in REGEXES[:2]),
                           *(_structured("grammar", g) for g in GRAMMARS[:2]), _structured("choice", CHOICES[0]),
                           _structured("grammar", GRAMMARS[4]), value("num_resumed_tokens 10**9", {
                               "regex": "[a-z]+", "num_resumed_tokens": 10**9}),
                           value("num_resumed_tokens -1", {"regex": "[a-z]+", "num_resumed_tokens": -1}),
                           value("two kinds", {"regex": "a", "choice": ["a"]})),
    "response_format": tuple(_response_format(s) for s in SCHEMAS[:5]) + (value("an unknown type", {"type": "xml"}),),
    "tools": (*(_tools(s) for s in SCHEMAS[:5]), lazy(f"{WORDS:,} tools", lambda: [
                  {"type": "function", "function": {"name": w, "parameters": {"type": "object"}}} for w in _words()]),
              lazy("a huge description", lambda: [
                  {"type": "function", "function": {"name": "f", "description": "d" * 1_100_000}}])),
    "tool_choice": (value("required over 1,000 tools", "required", tools=[
                        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
                        for i in range(1000)]),
                    value("a tool that is not there", {"type": "function", "function": {"name": "g"}}, tools=[_TOOL]),
                    value("required, no tools", "required")),
    "chat_template": (value("a loop of 10**9", "{% for x in range(10**9) %}x{% endfor %}"),
                      value("a macro that calls itself", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
                      value("reaching for Python", "{{ ''.__class__.__mro__[1].__subclasses__() }}")),
    "chat_template_kwargs": (value("a reserved name", {"messages": []}),
                             lazy(f"{HUGE_ITEMS:,} names", lambda: {f"k{i}": i for i in range(HUGE_ITEMS)})),
    "documents": (lazy(f"{HUGE_ITEMS:,} documents", lambda: [{"text": "a"}] * HUGE_ITEMS),),
    "kv_transfer_params.remote_url": (value("the metadata service", "http://169.254.169.254/latest/"),),
    # The Responses API (/v1/responses)
    "input": (lazy(f"{HUGE_ITEMS:,} items", lambda: [{"role": "user", "content": "hi"}] * HUGE_ITEMS),
              lazy("a tool output 10,000 deep", lambda: [{"type": "function_call_output", "call_id": "c",
                                                          "output": "[" * DEPTH + "]" * DEPTH}]),
              value("an item of an unknown type", [{"type": "web_search_call"}]),
              value("a built-in tool's call", [{"type": "computer_call", "call_id": "c"}])),
    "max_output_tokens": (value("10**9", 10**9), value("0", 0)),
    "metadata": (lazy("17 pairs", lambda: {f"k{i}": "v" for i in range(17)}),
                 lazy("a huge value", lambda: {"k": "v" * HUGE_CHARS})),
    "previous_response_id": (value("an id never stored", "resp_0123456789abcdef"), value("a path", "../../etc/passwd"),
                             value("a SQL quote", "resp_' OR '1'='1")),
    "text": tuple(value(f"text.format with {h.label}", {"format": {"type": "json_schema", "name": "n", "schema": s}})
                  for h, s in ((SCHEMAS[0], SELF_REF), (SCHEMAS[4], {"type": "string", "pattern": "^(a+)+$"}))) + (
                  lazy(f"text.format with an enum of {WORDS:,}", lambda: {"format": {
                      "type": "json_schema", "name": "n", "schema": {"enum": _words()}}}),
                  value("an unknown format", {"format": {"type": "xml"}})),
    "reasoning": (value("an unknown effort", {"effort": "maximal"}), value("a summary", {"summary": "auto"})),
}
"""Field name -> its attacks beyond its type's values (the module doc)."""
