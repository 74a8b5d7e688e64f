"""The request fields that constrain the output (a mixin of ``SamplingFields``): OpenAI's ``response_format``,
vLLM's ``structured_outputs`` and its older ``guided_*`` spellings, all read into one
``StructuredOutputsParams`` (serving/structured_outputs.py) that the engine compiles with xgrammar.

    response_format   {"type": "text"} | {"type": "json_object"} |
                      {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
    structured_outputs {"json": schema} | {"json_object": true} | {"regex": r} | {"choice": [..]} | {"grammar": ebnf}
                      (+ "disable_any_whitespace", and kvmesh's "num_resumed_tokens": the prompt's last N tokens
                      already matched it, as a migrated stream's continuation says); the seam other request
                      fields use too: tool calls that must
                      be made write their arguments' schema here as {"json": schema}
    guided_json / guided_regex / guided_choice / guided_grammar   the same, one field each

Only one of them may be set. Their shape is checked here (the router checks it too); whether a schema, regex
or grammar compiles is the replica's engine's check (a 400 naming the field as well).
"""

from __future__ import annotations

from typing import Annotated

from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from kvmesh.replica.serving.sampling_params import SamplingParamsError
from kvmesh.replica.serving.structured_outputs import KINDS, StructuredOutputsParams
from pydantic import Field

_Text = Annotated[str, Field(strict=True)]
BACKENDS = (None, "auto", "xgrammar")
"""``guided_decoding_backend`` values served (xgrammar is the one backend)."""
_OPTIONS = {"disable_any_whitespace", "disable_fallback", "num_resumed_tokens"}
"""``structured_outputs`` keys besides the kinds that are read (``disable_fallback``: there is one backend, so no
fallback to disable; ``num_resumed_tokens``: kvmesh's, serving/structured_outputs.py)."""
_UNSUPPORTED = {"whitespace_pattern": "xgrammar takes no whitespace pattern; use disable_any_whitespace",
                "structural_tag": "structural tags are not supported",
                "disable_additional_properties": "it is read by the guidance backend only; xgrammar already "
                                                 "refuses properties a schema does not list unless it allows them"}


class StructuredOutputFields(OpenAIBaseModel):
    """The fields (completions and chat alike, as vLLM's)."""

    structured_outputs: JSONObject | None = None
    """vLLM's: exactly one of ``json``, ``json_object``, ``regex``, ``choice``, ``grammar``
    (+ ``disable_any_whitespace``)."""
    response_format: JSONObject | None = None
    """OpenAI's: ``{"type": "text" | "json_object" | "json_schema"}`` (``json_schema``: ``{"name", "schema",
    "strict"}``; the schema is always enforced, as vLLM does whatever ``strict`` says)."""
    guided_json: _Text | JSONObject | None = None
    """vLLM's older spelling of ``structured_outputs.json``."""
    guided_regex: _Text | None = None
    """vLLM's older spelling of ``structured_outputs.regex``."""
    guided_choice: list[_Text] | None = None
    """vLLM's older spelling of ``structured_outputs.choice``."""
    guided_grammar: _Text | None = None
    """vLLM's older spelling of ``structured_outputs.grammar``."""
    guided_decoding_backend: _Text | None = None
    """vLLM's older per-request backend: "xgrammar" or "auto" (xgrammar is the one backend here)."""

    @property
    def sends_constraint(self) -> bool:
        """Whether any of the fields is set (most requests: none, and nothing to read further; this is asked per
        request at the router and the replica)."""
        return not (self.structured_outputs is None and self.response_format is None and self.guided_json is None
                    and self.guided_regex is None and self.guided_choice is None and self.guided_grammar is None)

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The one constraint the request's fields set (None: none); ``SamplingParamsError`` naming the field."""
        if self.guided_decoding_backend not in BACKENDS:
            raise SamplingParamsError("guided_decoding_backend", "guided_decoding_backend must be 'xgrammar' or "
                                      f"'auto' (the one backend here), got {echo(repr(self.guided_decoding_backend))}")
        if not self.sends_constraint:
            return None
        found = [p for p in (self._from_structured_outputs(), self._from_response_format(), *self._from_guided())
                 if p is not None]
        if len(found) > 1:
            raise SamplingParamsError(found[1].field, f"{found[0].field} and {found[1].field} both constrain the "
                                      "output; send one of them")
        return found[0] if found else None

    def _from_structured_outputs(self) -> StructuredOutputsParams | None:
        so = self.structured_outputs
        if not so:
            return None
        for key in so:
            if key in _UNSUPPORTED and so[key] not in (None, False, ""):
                raise SamplingParamsError(f"structured_outputs.{key}",
                                          f"structured_outputs.{key} is not supported ({_UNSUPPORTED[key]})")
            if key not in KINDS and key not in _OPTIONS and key not in _UNSUPPORTED:
                raise SamplingParamsError(f"structured_outputs.{key}", f"structured_outputs has no field "
                                          f"{echo(repr(key))}; use one of {', '.join(KINDS)}")
        options = {"disable_any_whitespace": _flag(so, "disable_any_whitespace"),
                   "num_resumed_tokens": so.get("num_resumed_tokens") or 0}
        _flag(so, "json_object")
        if so.get("json") is not None:
            if sum(so.get(k) not in (None, False) for k in KINDS) > 1:
                raise SamplingParamsError("structured_outputs", "structured_outputs must set exactly one of "
                                          f"{', '.join(KINDS)}")
            return StructuredOutputsParams.from_schema(so["json"], "structured_outputs.json", **options)
        choice = so.get("choice")
        if choice is not None and not isinstance(choice, list):
            raise SamplingParamsError("structured_outputs.choice",
                                      "structured_outputs.choice must be a list of strings")
        for name in ("regex", "grammar"):
            if so.get(name) is not None and not isinstance(so[name], str):
                raise SamplingParamsError(f"structured_outputs.{name}", f"structured_outputs.{name} must be a string")
        return StructuredOutputsParams(json_object=bool(so.get("json_object")), regex=so.get("regex"),
                                       choice=None if choice is None else tuple(choice), grammar=so.get("grammar"),
                                       field="structured_outputs", **options)

    def _from_response_format(self) -> StructuredOutputsParams | None:
        rf = self.response_format
        if not rf:
            return None
        kind = rf.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True, field="response_format")
        if kind != "json_schema":
            raise SamplingParamsError("response_format", "response_format.type must be 'text', 'json_object' or "
                                      f"'json_schema', got {echo(repr(kind))}")
        spec = rf.get("json_schema")
        if not isinstance(spec, dict):
            raise SamplingParamsError("response_format.json_schema", "response_format.json_schema must be an object "
                                      "with the schema under 'schema' (and 'name', 'strict')")
        if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
            raise SamplingParamsError("response_format.json_schema.strict",
                                      "response_format.json_schema.strict must be a boolean")
        if spec.get("schema") is None:
            raise SamplingParamsError("response_format.json_schema.schema",
                                      "response_format.json_schema.schema is required: the JSON schema to follow")
        return StructuredOutputsParams.from_schema(spec["schema"], "response_format.json_schema.schema")

    def _from_guided(self) -> list[StructuredOutputsParams | None]:
        return [
            None if self.guided_json is None else StructuredOutputsParams.from_schema(self.guided_json, "guided_json"),
            None if self.guided_regex is None else StructuredOutputsParams(regex=self.guided_regex,
                                                                           field="guided_regex"),
            None if self.guided_choice is None else StructuredOutputsParams(choice=tuple(self.guided_choice),
                                                                            field="guided_choice"),
            None if self.guided_grammar is None else StructuredOutputsParams(grammar=self.guided_grammar,
                                                                             field="guided_grammar"),
        ]

    def check_structured_outputs(self) -> None:
        """The fields' shape as a 400 naming the field (``to_sampling_params`` reads them again)."""
        try:
            self.structured_outputs_params()
        except SamplingParamsError as e:
            raise ProtocolError(str(e), param=e.param) from None


def _flag(so: JSONObject, key: str) -> bool | None:
    value = so.get(key)
    if value is not None and not isinstance(value, bool):
        raise SamplingParamsError(f"structured_outputs.{key}", f"structured_outputs.{key} must be a boolean")
    return value
