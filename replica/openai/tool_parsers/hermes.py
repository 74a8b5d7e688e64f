"""Hermes' tool calls (NousResearch Hermes 2/3, Qwen 2.5/3): each call a JSON object between tags.

    I will look it up.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Text before the first ``<tool_call>`` is the message's content; text between and after calls is dropped (vLLM's
``hermes`` parser does the same).
"""

from __future__ import annotations

from typing import ClassVar

from kvmesh.replica.openai.tool_parsers.base import ParsedOutput, call_from_object, held_back
from kvmesh.replica.openai.tool_parsers.json_scan import scan_object, skip_whitespace

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


class HermesToolParser:
    name: ClassVar[str] = "hermes"
    reads_special_tokens: ClassVar[bool] = True  # Qwen's and Hermes' tokenizers mark <tool_call> special

    def parse(self, text: str, final: bool) -> ParsedOutput:
        first = text.find(TOOL_CALL_START)
        if first < 0:
            return ParsedOutput(len(text) if final else len(text) - held_back(text, TOOL_CALL_START))
        parsed = ParsedOutput(first)
        at = first
        while at >= 0:
            start = skip_whitespace(text, at + len(TOOL_CALL_START))
            if start >= len(text):
                break
            scan = scan_object(text, start)
            parsed.calls.append(call_from_object(text, scan, ("arguments",)))
            if scan.end is None:
                break
            at = text.find(TOOL_CALL_START, scan.end)
        return parsed
