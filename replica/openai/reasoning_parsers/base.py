"""What a reasoning parser reads out of generated text, and the interface every parser has.

A reasoning model writes its thinking first, then its answer:

    <think>                 the start tag (often written by the chat template into the prompt instead)
    The user asks for ...   reasoning -> ``message.reasoning_content`` / ``delta.reasoning_content``
    </think>                the end tag
    Paris.                  content   -> ``message.content``; tool calls and structured outputs read this part

A parser knows its tags and where the reasoning of a text ends (``find_end``); stream.py does the rest the same
way for every parser: the start tag dropped, tags cut across deltas held back until they are whole or cannot be,
an answer that never ends its reasoning is all reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from kvmesh.replica.openai.tool_parsers.base import held_back


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    """Where the reasoning ends in a text."""

    reasoning_stop: int
    """The reasoning runs up to ``text[:reasoning_stop]``."""
    content_start: int
    """The answer (content) is ``text[content_start:]`` (after the end tag)."""


class ReasoningParser(Protocol):
    """Reads the reasoning out of a model's text in one model family's format."""

    name: ClassVar[str]
    """The ``--reasoning-parser`` value that selects it (vLLM's name for the same format)."""
    start_tag: ClassVar[str]
    end_tag: ClassVar[str]
    end_pattern: ClassVar[str | None]
    """A regular expression whose match ends the reasoning besides ``end_tag`` (None: only the tag): what the engine
    starts a constraint at (``StructuredOutputsParams.reasoning_end_pattern``)."""
    opener: ClassVar[str | None]
    """A tag that may end the reasoning depending on what follows it, whitespace aside (qwen3's ``<tool_call>``):
    while the undecided text is this tag and whitespace, more whitespace decides nothing (stream.py keeps it
    aside instead of reading it again). None: no such tag."""
    thinking: bool
    """The answer begins with reasoning; False: the whole answer is content (the template turned thinking off)."""
    constrained: bool
    """The answer's content is a constraint's output (a structured output or a forced tool call that waits for the
    reasoning): text that ended the reasoning without an end tag is not content (the constraint starts after it)."""

    def find_end(self, text: str, start: int, final: bool) -> ReasoningEnd | int:
        """Where the reasoning in ``text[start:]`` ends; when it does not yet: how far ``text`` is surely reasoning
        (a possible start of the end tag is held back; ``final``: the text is complete, so all of it)."""
        ...


class ThinkTagParser:
    """``<think>`` ... ``</think>``: the format both vLLM parsers kvmesh has share."""

    name: ClassVar[str] = ""
    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    end_pattern: ClassVar[str | None] = None
    opener: ClassVar[str | None] = None

    def __init__(self, chat_template_kwargs: Mapping[str, object] | None = None, constrained: bool = False) -> None:
        self.thinking, self.constrained = True, constrained

    def find_end(self, text: str, start: int, final: bool) -> ReasoningEnd | int:
        at = text.find(self.end_tag, start)
        if at >= 0:
            return ReasoningEnd(at, at + len(self.end_tag))
        return len(text) if final else len(text) - held_back(text, self.end_tag)
