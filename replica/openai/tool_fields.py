"""The chat request's tool fields (a mixin of ``ChatCompletionRequest``): ``tools``, ``tool_choice``,
``parallel_tool_calls``, read as vLLM reads them.

    tools        [{"type": "function", "function": {"name", "description"?, "parameters"?: JSON schema}}]
                 rendered into the chat template as its ``tools``
    tool_choice  "none"   the model answers in text (the default without tools)
                 "auto"   the model may call; a parser reads calls out of its text (the default with tools; needs
                          the server's --enable-auto-tool-choice and --tool-call-parser)
                 "required" / {"type": "function", "function": {"name": ...}}
                          the model must call: the output is constrained, through ``structured_outputs.json``, to
                          vLLM's schema over the tools' parameters (``tool_schema``)
"""

from __future__ import annotations

from typing import Annotated

from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.openai.tool_parsers import TOOL_PARSERS
from kvmesh.replica.openai.tool_parsers.base import ToolParser
from kvmesh.replica.openai.tool_parsers.forced import NamedToolCall, RequiredToolCalls
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import Field, JsonValue

_Flag = Annotated[bool, Field(strict=True)]
CHOICES = ("none", "auto", "required")
_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}
AUTO_FLAGS = "--enable-auto-tool-choice and --tool-call-parser"


class ToolFields(OpenAIBaseModel):
    """OpenAI's tool fields."""

    tools: list[JsonValue] | None = None
    """Functions the model may call (checked by ``check_tools``: a 400 naming the part that is wrong)."""
    tool_choice: JsonValue = None
    """"none", "auto", "required" or ``{"type": "function", "function": {"name": ...}}``; unset: "auto" with
    tools, else "none" (vLLM's default)."""
    parallel_tool_calls: _Flag | None = None
    """False: at most one call per answer (the first; a "required" schema allows one item). Default: any number."""

    def check_tools(self) -> None:
        """The tools and tool_choice as a 400 naming the part that is wrong."""
        names = tool_names(self.tools)
        choice = self.tool_choice
        if choice is None or choice in CHOICES:
            if choice not in (None, "none") and not self.tools:
                raise ProtocolError(f"tool_choice {choice!r} needs tools: send the functions the model may call",
                                    param="tool_choice")
            return
        if isinstance(choice, str) or not isinstance(choice, dict):
            raise ProtocolError(f"tool_choice must be one of {', '.join(CHOICES)} or {{\"type\": \"function\", "
                                f"\"function\": {{\"name\": ...}}}}, got {echo(repr(choice))}", param="tool_choice")
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise ProtocolError("tool_choice names a function as {\"type\": \"function\", \"function\": {\"name\": "
                                "...}}", param="tool_choice.function.name")
        if name not in names:
            raise ProtocolError(f"tool_choice names {echo(repr(name))}, which is not among the tools "
                                f"({', '.join(names) or 'none sent'})", param="tool_choice.function.name")

    @property
    def effective_tool_choice(self) -> str:
        """"none", "auto", "required", or "named" (``tool_choice`` names one function)."""
        if isinstance(self.tool_choice, dict):
            return "named"
        return self.tool_choice or ("auto" if self.tools else "none")

    def check_tool_choice_served(self, enable_auto_tool_choice: bool, tool_call_parser: str | None) -> None:
        """``auto`` needs a server started with ``--enable-auto-tool-choice --tool-call-parser`` (vLLM's 400)."""
        if self.effective_tool_choice == "auto" and not (enable_auto_tool_choice and tool_call_parser):
            raise ProtocolError(f'"auto" tool choice requires {AUTO_FLAGS} to be set on the server (the default '
                                'when tools are sent); send tool_choice "none", "required" or a named function',
                                param="tool_choice")

    def tool_schema(self) -> JSONObject | None:
        """The JSON schema the output must follow (vLLM's rule), None unless ``tool_choice`` makes the model call:
        a named function's parameters, or for "required" an array (at least one item) of ``{"name",
        "parameters"}`` objects, any of the tools."""
        kind = self.effective_tool_choice
        if kind == "named":
            parameters = self._function(self.tool_choice["function"]["name"]).get("parameters")
            return dict(parameters) if parameters else dict(_EMPTY_PARAMETERS)
        if kind != "required":
            return None
        items = [{"properties": {"name": {"type": "string", "enum": [f["name"]]}, "parameters": self._parameters(f)},
                  "required": ["name", "parameters"]} for f in map(_function, self.tools)]
        schema: JSONObject = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
        if self.parallel_tool_calls is False:
            schema["maxItems"] = 1
        defs = self._shared_defs()
        if defs:
            schema["$defs"] = defs
        return schema

    def adjust_for_tool_parser(self, tool_call_parser: str | None) -> None:
        """vLLM's ``ToolParser.adjust_request``: with tools and a tool choice other than "none", a server parser whose
        markers may be special tokens (hermes' ``<tool_call>``) gets the text with special tokens kept; skipped, the
        markers would be gone before it reads the calls."""
        if (self.tools and self.effective_tool_choice != "none" and tool_call_parser
                and TOOL_PARSERS[tool_call_parser].reads_special_tokens):
            self.skip_special_tokens = False

    def tool_parser(self, tool_call_parser: str | None) -> ToolParser | None:
        """What reads this request's calls out of its output (None: the output is plain text)."""
        kind = self.effective_tool_choice
        if kind == "named":
            return NamedToolCall(self.tool_choice["function"]["name"])
        if kind == "required":
            return RequiredToolCalls()
        if kind == "auto" and tool_call_parser:
            return TOOL_PARSERS[tool_call_parser]()
        return None

    def _function(self, name: str) -> JSONObject:
        return next(f for f in map(_function, self.tools) if f["name"] == name)

    @staticmethod
    def _parameters(function: JSONObject) -> JSONObject:
        """The parameters' schema, ``$defs`` lifted to the top (``_shared_defs``) for "required"."""
        parameters = function.get("parameters")
        return {k: v for k, v in parameters.items() if k != "$defs"} if parameters else dict(_EMPTY_PARAMETERS)

    def _shared_defs(self) -> JSONObject:
        defs: JSONObject = {}
        for i, function in enumerate(map(_function, self.tools)):
            for name, schema in ((function.get("parameters") or {}).get("$defs") or {}).items():
                if name in defs and defs[name] != schema:
                    raise ProtocolError(f"tools define $defs {echo(repr(name))} twice, differently; rename one",
                                        param=f"tools.{i}.function.parameters")
                defs[name] = schema
        return defs


def tool_names(tools: list[JsonValue] | None) -> list[str]:
    """The tools' function names after checking each tool's shape (a 400 naming the part that is wrong)."""
    return [_function_name(tool, i) for i, tool in enumerate(tools or [])]


def _function(tool: JsonValue) -> JSONObject:
    return tool["function"]


def _function_name(tool: JsonValue, i: int) -> str:
    """The tool's function name after checking its shape (a 400 naming ``tools.i...``)."""
    where = f"tools.{i}"
    if not isinstance(tool, dict):
        raise ProtocolError(f"{where} must be an object {{\"type\": \"function\", \"function\": {{...}}}}", param=where)
    if tool.get("type", "function") != "function":
        raise ProtocolError(f"{where}.type must be \"function\", got {echo(repr(tool.get('type')))}",
                            param=f"{where}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ProtocolError(f"{where}.function must be an object with a name", param=f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}.function.name must be a non-empty string", param=f"{where}.function.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ProtocolError(f"{where}.function.description must be a string", param=f"{where}.function.description")
    _check_schema(function.get("parameters"), f"{where}.function.parameters")
    return name


def _check_schema(schema: JsonValue, where: str) -> None:
    """A JSON schema's outer shape: an object whose ``type`` (when set) is a JSON type or a list of them (whether it
    compiles is the engine's check when the output is constrained to it)."""
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise ProtocolError(f"{where} must be a JSON schema (an object), got {echo(repr(schema))}", param=where)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is not None and not all(isinstance(k, str) and k in _SCHEMA_TYPES for k in kinds):
        raise ProtocolError(f"{where}.type must be one of {', '.join(sorted(_SCHEMA_TYPES))}, got "
                            f"{echo(repr(kind))}", param=where)
    for key in ("properties", "$defs"):
        if key in schema and not isinstance(schema[key], dict):
            raise ProtocolError(f"{where}.{key} must be an object", param=where)
