"""What a request's output must match (vLLM's ``StructuredOutputsParams``): a JSON schema, any JSON object, a
regex, one of some strings, or an EBNF grammar. Torch-free: the OpenAI layer builds it (router and replica
alike), the engine compiles it (engine/structured_output.py, with xgrammar) and masks the logits by it.

Exactly one of ``json``, ``json_object``, ``regex``, ``choice``, ``grammar`` is set. ``field`` remembers which
request field it came from, so an error about it names what the client sent (``response_format``,
``guided_json``, ``structured_outputs``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvmesh.replica.serving.json_types import JSONObject
from kvmesh.replica.serving.sampling_params_error import SamplingParamsError

KINDS = ("json", "json_object", "regex", "choice", "grammar")
"""The kinds of constraint, as vLLM's ``structured_outputs`` keys spell them."""
MAX_SCHEMA_DEPTH = 128
"""Most JSON levels a schema document may nest (about 64 levels of objects in objects): xgrammar's time to read a
schema grows steeply with its depth (0.2 s at 75 levels of objects, seconds at 100)."""


def json_depth(value: object) -> int:
    """How many levels of objects and arrays ``value`` nests (a scalar: 0), without recursion."""
    depth, level = 0, [(value, 1)]
    while level:
        item, d = level.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            depth = max(depth, d)
            level.extend((child, d + 1) for child in children)
    return depth


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """One request's output constraint (exactly one kind set; hashable: ``key`` names compiled grammars)."""

    json: str | None = None
    """A JSON schema, as canonical JSON text (``from_schema`` writes it): the output is a JSON value matching it."""
    json_object: bool = False
    """The output is any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
    regex: str | None = None
    """The output matches this regular expression (xgrammar's syntax, ECMAScript-like)."""
    choice: tuple[str, ...] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """The output is a sentence of this EBNF grammar (xgrammar's / GBNF syntax, rule ``root`` first)."""
    disable_any_whitespace: bool | None = None
    """JSON kinds: True writes JSON without whitespace between tokens, False lets the model put any; None: the
    engine's default (no whitespace, so a small model closes its object instead of padding it with blanks)."""
    field: str = "structured_outputs"
    """The request field it came from (errors name it)."""
    num_resumed_tokens: int = 0
    """(kvmesh) The prompt's last this many tokens are output the constraint already matched: the answer goes on
    from there (a migrated stream's continuation, router/http/migration.py). Not part of ``key``."""
    reasoning_end: str | None = None
    """(kvmesh) The constraint starts after the output writes this text: the end tag of the server's reasoning
    parser, so the answer after the reasoning is constrained and the reasoning is not (vLLM's ``reasoning_ended``).
    None: from the first token. Set by the server, never read from a request; not part of ``key``."""
    reasoning_end_pattern: str | None = None
    """(kvmesh) With ``reasoning_end``: a regular expression whose match ends the reasoning too, the rest of the
    server's reasoning parser's rule (qwen3's: a tool call opened inside the thinking); the constraint starts there.
    None: at ``reasoning_end`` only. Set by the server, never read from a request; not part of ``key``."""
    tenant: str = ""
    """(kvmesh) Whose compile this is: the request's ``user`` (all a replica knows of its sender); waiting compiles
    take turns by it (engine/grammar_pool.py). Not part of ``key``."""

    def _kinds(self) -> dict[str, object]:
        return {"json": self.json, "json_object": self.json_object, "regex": self.regex, "choice": self.choice,
                "grammar": self.grammar}

    def __post_init__(self) -> None:
        kinds = [k for k, v in self._kinds().items() if v not in (None, False)]
        if len(kinds) != 1:
            raise SamplingParamsError(self.field, f"{self.field} must set exactly one of {', '.join(KINDS)}"
                                      f"{'; got ' + ', '.join(kinds) if kinds else ''}")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise SamplingParamsError(self.field, f"{self.field}: choice must be a non-empty list of non-empty strings")
        if not isinstance(self.num_resumed_tokens, int) or isinstance(self.num_resumed_tokens, bool) \
                or self.num_resumed_tokens < 0:
            raise SamplingParamsError(f"{self.field}.num_resumed_tokens", f"{self.field}.num_resumed_tokens must be "
                                      f"an integer >= 0, got {self.num_resumed_tokens!r}")
        for name, value in (("regex", self.regex), ("grammar", self.grammar), ("reasoning_end", self.reasoning_end),
                            ("reasoning_end_pattern", self.reasoning_end_pattern)):
            if value is not None and (not isinstance(value, str) or not value):
                raise SamplingParamsError(self.field, f"{self.field}: {name} must be a non-empty string")

    @property
    def kind(self) -> str:
        return next(k for k, v in self._kinds().items() if v not in (None, False))

    @property
    def key(self) -> tuple[str, str, bool | None]:
        """What a compiled grammar is cached by: the same key, the same grammar."""
        kind = self.kind
        value = self._kinds()[kind]
        return kind, json.dumps(value) if not isinstance(value, str) else value, self.disable_any_whitespace

    def to_request(self) -> JSONObject:
        """This constraint as a request's ``structured_outputs`` object (what a continuation sends)."""
        kind = self.kind
        value = {"json": lambda: json.loads(self.json), "json_object": lambda: True, "regex": lambda: self.regex,
                 "choice": lambda: list(self.choice), "grammar": lambda: self.grammar}[kind]()
        body: JSONObject = {kind: value}
        if self.disable_any_whitespace is not None:
            body["disable_any_whitespace"] = self.disable_any_whitespace
        if self.num_resumed_tokens:
            body["num_resumed_tokens"] = self.num_resumed_tokens
        return body

    @classmethod
    def from_schema(cls, schema: JSONObject | bool | str, field: str, **kwargs) -> StructuredOutputsParams:
        """A JSON-schema constraint from a schema (an object, true/false, or JSON text of one)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise SamplingParamsError(field, f"{field}: the JSON schema is not valid JSON ({e})") from None
        if not isinstance(schema, dict | bool):
            raise SamplingParamsError(field, f"{field}: a JSON schema must be an object or a boolean, "
                                      f"got {type(schema).__name__}")
        if (depth := json_depth(schema)) > MAX_SCHEMA_DEPTH:
            raise SamplingParamsError(field, f"{field}: the JSON schema nests {depth} levels deep; send one of at "
                                      f"most {MAX_SCHEMA_DEPTH}")
        return cls(json=json.dumps(schema, sort_keys=True, separators=(",", ":")), field=field, **kwargs)
