"""Llama 3.1/3.2's JSON tool calls: the whole answer is calls, each a JSON object, ``;`` between them.

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

The ``<|python_tag|>`` is optional; an answer that starts with neither it nor ``{`` is plain content, one that does
has no content (vLLM's ``llama3_json`` parser reads the same; ``arguments`` is accepted for ``parameters``).
"""

from __future__ import annotations

from typing import ClassVar

from kvmesh.replica.openai.tool_parsers.base import ParsedOutput, call_from_object
from kvmesh.replica.openai.tool_parsers.json_scan import scan_object, skip_whitespace

BOT_TOKEN = "<|python_tag|>"


class Llama3JsonToolParser:
    name: ClassVar[str] = "llama3_json"
    reads_special_tokens: ClassVar[bool] = False

    def parse(self, text: str, final: bool) -> ParsedOutput:
        at = skip_whitespace(text, 0)
        rest = text[at:]
        if not final and (not rest or (BOT_TOKEN.startswith(rest) and rest != BOT_TOKEN)):
            return ParsedOutput(0)  # may still become a call
        if rest.startswith(BOT_TOKEN):
            at = skip_whitespace(text, at + len(BOT_TOKEN))
        elif not rest.startswith("{"):
            return ParsedOutput(len(text))
        parsed = ParsedOutput(0)
        while at < len(text) and text[at] == "{":
            scan = scan_object(text, at)
            parsed.calls.append(call_from_object(text, scan, ("parameters", "arguments")))
            if scan.end is None:
                break
            at = skip_whitespace(text, scan.end)
            if at < len(text) and text[at] == ";":
                at = skip_whitespace(text, at + 1)
        return parsed
