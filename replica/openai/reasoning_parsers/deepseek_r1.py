"""DeepSeek-R1's reasoning (and QwQ's, and R1's distilled models'): ``<think>`` ... ``</think>``, then the answer.

    <think>\nLet me work it out ...\n</think>\n\nThe answer is 4.

R1's chat template ends the prompt with ``<think>\\n``, so the model's text usually lacks the start tag: what comes
before ``</think>`` is reasoning all the same, and an answer cut off before ``</think>`` is all reasoning (vLLM's
``deepseek_r1`` parser reads it the same way).
"""

from __future__ import annotations

from typing import ClassVar

from kvmesh.replica.openai.reasoning_parsers.base import ThinkTagParser


class DeepSeekR1ReasoningParser(ThinkTagParser):
    name: ClassVar[str] = "deepseek_r1"
