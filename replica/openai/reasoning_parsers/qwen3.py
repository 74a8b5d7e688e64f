"""Qwen3's reasoning (Qwen3, Qwen3.5, QwQ's successors): ``<think>`` ... ``</think>``, with a switch to turn it off.

    <think>\nThe user wants ...\n</think>\n\nHello!

Read as vLLM's ``qwen3`` parser reads it:

- the chat template may write ``<think>`` into the prompt: text before ``</think>`` is reasoning without it;
- ``chat_template_kwargs: {"enable_thinking": false}`` makes the template write an empty think block into the
  prompt: the whole answer is content;
- Qwen3.5 may call a tool from inside its thinking: ``<tool_call>`` followed by ``<function`` ends the reasoning
  there, the call (tag included) being the content; for a constrained answer (a structured output or a forced tool
  call) the constraint starts right after that opener, so the content is what the constraint wrote after it;
- an answer cut off before ``</think>`` is all reasoning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

from kvmesh.replica.openai.reasoning_parsers.base import ReasoningEnd, ThinkTagParser
from kvmesh.replica.openai.tool_parsers.base import held_back

TOOL_CALL_TAG = "<tool_call>"
FUNCTION_OPEN = "<function"
_FUNCTION = re.compile(r"\s*<function[\s=]")
"""What must follow TOOL_CALL_TAG for it to open a call."""


class Qwen3ReasoningParser(ThinkTagParser):
    name: ClassVar[str] = "qwen3"
    end_pattern: ClassVar[str | None] = re.escape(TOOL_CALL_TAG) + _FUNCTION.pattern
    opener: ClassVar[str | None] = TOOL_CALL_TAG

    def __init__(self, chat_template_kwargs: Mapping[str, object] | None = None, constrained: bool = False) -> None:
        super().__init__(chat_template_kwargs, constrained)
        self.thinking = bool((chat_template_kwargs or {}).get("enable_thinking", True))

    def find_end(self, text: str, start: int, final: bool) -> ReasoningEnd | int:
        end = super().find_end(text, start, final)
        stop = end.reasoning_stop if isinstance(end, ReasoningEnd) else len(text)
        at = text.find(TOOL_CALL_TAG, start, stop)
        while at >= 0:  # a call from inside the thinking, when <function follows
            after = at + len(TOOL_CALL_TAG)
            if (opener := _FUNCTION.match(text, after)) is not None:
                return ReasoningEnd(at, opener.end() if self.constrained else at)
            rest = text[after:].lstrip()
            if not final and FUNCTION_OPEN.startswith(rest):  # undecided until more text comes
                return at
            at = text.find(TOOL_CALL_TAG, after, stop)
        if isinstance(end, ReasoningEnd) or final:
            return end
        return min(end, len(text) - held_back(text, TOOL_CALL_TAG))
