"""One answer's text -> its reasoning and its content, whole or as streamed deltas.

    feed("<thi")        -> ("", "")         a tag cut across deltas is held back until it is whole or cannot be
    feed("nk>Let me")   -> ("Let me", "")   the start tag is dropped
    feed(" see</th")    -> (" see", "")
    feed("ink>\\n4")     -> ("", "\\n4")     everything after the end tag is content

The whole answer is the same fed in one piece (``split``), so a streamed answer joins to the whole one for any cut
of the text into deltas. Each delta is read once: text held back is a tag's few characters, or a parser's opener
followed by whitespace, which is set aside (``spaces``) rather than read again with every delta.
"""

from __future__ import annotations

from kvmesh.replica.openai.reasoning_parsers.base import ReasoningEnd, ReasoningParser
from kvmesh.replica.openai.tool_parsers.base import held_back


class ReasoningStream:
    """The reasoning and content deltas of one streamed answer: ``feed`` each new piece of text."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.held = ""  # text not given out yet: a possible tag (what is given out is not kept)
        self.spaces: list[str] | None = None  # whitespace deltas after a held opener (None: held is not one)
        self.in_reasoning = parser.thinking
        self._start_open = parser.thinking  # the start tag may still come (dropped once, before the end)

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """(reasoning delta, content delta) after ``delta`` (``final``: the last piece)."""
        if not self.in_reasoning:
            return "", delta
        if self.spaces is not None:
            if not final and delta.isspace():
                self.spaces.append(delta)  # the opener is undecided still
                return "", ""
            self.held, self.spaces = self.held + "".join(self.spaces), None
        parser, text, at, reasoning = self.parser, self.held + delta, 0, ""
        if self._start_open:
            start = text.find(parser.start_tag)
            end = parser.find_end(text, 0, final)
            if start >= 0 and (not isinstance(end, ReasoningEnd) or start < end.reasoning_stop):
                reasoning, at = text[:start], start + len(parser.start_tag)
                self._start_open = False
            elif isinstance(end, ReasoningEnd):
                self._start_open = False
        end = parser.find_end(text, at, final)
        if isinstance(end, ReasoningEnd):
            self.held, self.in_reasoning = "", False
            return reasoning + text[at:end.reasoning_stop], text[end.content_start:]
        if self._start_open and not final:
            end = min(end, len(text) - held_back(text, parser.start_tag))
        end = max(end, at)
        self.held = text[end:]
        opener = parser.opener
        if opener is not None and self.held.startswith(opener) and (self.held[len(opener):].isspace()
                                                                    or len(self.held) == len(opener)):
            self.spaces = []
        return reasoning + text[at:end], ""


def split(parser: ReasoningParser, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished answer, as vLLM answers them: reasoning None when thinking is off,
    content None when nothing follows the reasoning."""
    reasoning, content = ReasoningStream(parser).feed(text, final=True)
    if not parser.thinking:
        return None, content
    return reasoning, content or None
