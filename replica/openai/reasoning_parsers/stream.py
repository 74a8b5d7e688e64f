"""One answer's text -> its reasoning and its content, whole or as streamed deltas.

    feed("<thi")        -> ("", "")         a tag cut across deltas is held back until it is whole or cannot be
    feed("nk>Let me")   -> ("Let me", "")   the start tag is dropped
    feed(" see</th")    -> (" see", "")
    feed("ink>\\n4")     -> ("", "\\n4")     everything after the end tag is content

The whole answer is the same fed in one piece (``split``), so a streamed answer joins to the whole one for any cut
of the text into deltas.
"""

from __future__ import annotations

from kvmesh.replica.openai.reasoning_parsers.base import ReasoningEnd, ReasoningParser
from kvmesh.replica.openai.tool_parsers.base import held_back


class ReasoningStream:
    """The reasoning and content deltas of one streamed answer: ``feed`` each new piece of text."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.at = 0  # text[:at] has been given out
        self.in_reasoning = parser.thinking
        self._start_open = parser.thinking  # the start tag may still come (dropped once, before the end)

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """(reasoning delta, content delta) after ``delta`` (``final``: the last piece)."""
        self.text += delta
        if not self.in_reasoning:
            return "", self._rest()
        parser, text, reasoning = self.parser, self.text, ""
        if self._start_open:
            start = text.find(parser.start_tag, self.at)
            end = parser.find_end(text, self.at, final)
            if start >= 0 and (not isinstance(end, ReasoningEnd) or start < end.reasoning_stop):
                reasoning, self.at = text[self.at:start], start + len(parser.start_tag)
                self._start_open = False
            elif isinstance(end, ReasoningEnd):
                self._start_open = False
        end = parser.find_end(text, self.at, final)
        if isinstance(end, ReasoningEnd):
            reasoning += text[self.at:end.reasoning_stop]
            self.at, self.in_reasoning = end.content_start, False
            return reasoning, self._rest()
        if self._start_open and not final:
            end = min(end, len(text) - held_back(text, parser.start_tag))
        end = max(end, self.at)
        reasoning += text[self.at:end]
        self.at = end
        return reasoning, ""

    def _rest(self) -> str:
        content, self.at = self.text[self.at:], len(self.text)
        return content


def split(parser: ReasoningParser, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished answer, as vLLM answers them: reasoning None when thinking is off,
    content None when nothing follows the reasoning."""
    reasoning, content = ReasoningStream(parser).feed(text, final=True)
    if not parser.thinking:
        return None, content
    return reasoning, content or None
