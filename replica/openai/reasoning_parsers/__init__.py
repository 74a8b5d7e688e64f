"""Reasoning parsers: split a reasoning model's text into its reasoning and its answer (vLLM's
``--reasoning-parser``).

A parser is one file with a class that has a ``name``, its tags and ``find_end`` (base.py); adding one is that file
and one line in ``REASONING_PARSERS``. stream.py splits a text with any of them, whole or delta by delta.
``split_reasoning`` is the one call for code that holds a finished text (the chat answer, the Responses API).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvmesh.replica.openai.reasoning_parsers.base import ReasoningParser
from kvmesh.replica.openai.reasoning_parsers.deepseek_r1 import DeepSeekR1ReasoningParser
from kvmesh.replica.openai.reasoning_parsers.qwen3 import Qwen3ReasoningParser
from kvmesh.replica.openai.reasoning_parsers.stream import ReasoningStream, split

REASONING_PARSERS: dict[str, type[DeepSeekR1ReasoningParser] | type[Qwen3ReasoningParser]] = {
    DeepSeekR1ReasoningParser.name: DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser.name: Qwen3ReasoningParser,
}
"""``--reasoning-parser`` values -> parser classes."""


def reasoning_parser(name: str, chat_template_kwargs: Mapping[str, object] | None = None,
                     constrained: bool = False) -> ReasoningParser:
    """The parser ``name`` for one answer (``chat_template_kwargs``: the request's, which may turn thinking off;
    ``constrained``: a constraint writes the content after the reasoning, base.py)."""
    return REASONING_PARSERS[name](chat_template_kwargs, constrained)


def split_reasoning(name: str, text: str, chat_template_kwargs: Mapping[str, object] | None = None
                    ) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished answer ``text`` read by the parser ``name`` (a ``REASONING_PARSERS``
    key): reasoning None when thinking is off, content None when nothing follows the reasoning."""
    return split(reasoning_parser(name, chat_template_kwargs), text)


__all__ = ["REASONING_PARSERS", "ReasoningParser", "ReasoningStream", "reasoning_parser", "split", "split_reasoning"]
