"""The calls of a request whose ``tool_choice`` makes the model call: its output is JSON under a schema
(tool_fields.py writes it), read here like a parser's format.

    tool_choice "required"        [{"name": "get_weather", "parameters": {"city": "Paris"}}, ...]
    tool_choice {"function": ...} {"city": "Paris"}          (the named function's arguments)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvmesh.replica.openai.tool_parsers.base import ParsedOutput, PartialCall, call_from_object
from kvmesh.replica.openai.tool_parsers.json_scan import scan_object, skip_whitespace, value_end


@dataclass(frozen=True, slots=True)
class NamedToolCall:
    """The whole output is the arguments of ``function``."""

    function: str
    name: ClassVar[str] = "named"
    reads_special_tokens: ClassVar[bool] = False

    def parse(self, text: str, final: bool) -> ParsedOutput:
        start = skip_whitespace(text, 0)
        end = value_end(text, start) if start < len(text) else None
        return ParsedOutput(0, [PartialCall(self.function, text[start:end] if end is not None else text[start:],
                                            end is not None)])


class RequiredToolCalls:
    """The output is an array of ``{"name", "parameters"}`` objects (at least one)."""

    name: ClassVar[str] = "required"
    reads_special_tokens: ClassVar[bool] = False

    def parse(self, text: str, final: bool) -> ParsedOutput:
        parsed = ParsedOutput(0)
        at = skip_whitespace(text, 0)
        if at >= len(text):
            return parsed
        if text[at] != "[":
            raise ValueError("the output is not an array of tool calls")
        at = skip_whitespace(text, at + 1)
        while at < len(text) and text[at] != "]":
            scan = scan_object(text, at)
            parsed.calls.append(call_from_object(text, scan, ("parameters",)))
            if scan.end is None:
                break
            at = skip_whitespace(text, scan.end)
            if at < len(text) and text[at] == ",":
                at = skip_whitespace(text, at + 1)
        return parsed
