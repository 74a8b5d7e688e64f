"""What a tool-call parser reads out of generated text, and the interface every parser has.

A parser sees the whole text generated so far (``final``: the generation is over) and says which prefix of it is
surely plain content and which tool calls it holds so far. It is asked again as the text grows, so what it says
only ever grows: content is a longer prefix, a call's name appears once whole, a call's arguments text gets
longer. tool_call_stream.py turns those snapshots into OpenAI's message and streamed deltas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from kvmesh.replica.openai.tool_parsers.json_scan import ObjectScan


@dataclass(slots=True)
class PartialCall:
    """One tool call as far as the text goes."""

    name: str | None
    """The function's name once its JSON string is whole; None before."""
    arguments: str
    """The arguments' JSON text so far (``"{}"`` for a finished call that gave none)."""
    complete: bool
    """The call's JSON is closed."""


@dataclass(slots=True)
class ParsedOutput:
    """A parser's reading of the text so far."""

    content_end: int
    """``text[:content_end]`` is plain content (text that may still start a call is held back until it does not)."""
    calls: list[PartialCall] = field(default_factory=list)


class ToolParser(Protocol):
    """Reads tool calls out of a model's text in one model family's format."""

    name: ClassVar[str]
    """The ``--tool-call-parser`` value that selects it (vLLM's name for the same format)."""
    reads_special_tokens: ClassVar[bool]
    """Its markers are special tokens in some models' tokenizers, so it reads the text with special tokens kept
    (vLLM's ``adjust_request`` turns ``skip_special_tokens`` off for such a parser)."""

    def parse(self, text: str, final: bool) -> ParsedOutput:
        """Content and calls of ``text``; ``ValueError`` where the text cannot be the format (then it is content)."""
        ...


def call_from_object(text: str, scan: ObjectScan, argument_keys: tuple[str, ...]) -> PartialCall:
    """A call written as a JSON object ``{"name": ..., <argument key>: {...}}``."""
    name = None
    if scan.complete("name"):
        name = json.loads(scan.value(text, "name"))
        if not isinstance(name, str):
            raise ValueError("a tool call's name is not a string")
    arguments = next((a for a in (scan.value(text, key) for key in argument_keys) if a is not None), None)
    if arguments is None:
        arguments = "{}" if scan.end is not None else ""
    return PartialCall(name, arguments, scan.end is not None)


def held_back(text: str, marker: str) -> int:
    """How many of ``text``'s last characters could be the start of ``marker`` (kept out of content until known)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
