"""One choice's generated text -> OpenAI's ``message.tool_calls``, whole or as streamed deltas.

    streamed   {"index": 0, "id": "chatcmpl-tool-..", "type": "function", "function": {"name": "f", "arguments": ""}}
               {"index": 0, "function": {"arguments": "{\\"city\\": "}}
               {"index": 0, "function": {"arguments": "\\"Paris\\"}"}}

A call is announced once its name is whole (calls in order: a later one waits for the earlier's name); its
arguments follow as the text grows, so their chunks joined are the arguments of the whole answer. Text the parser
cannot read (``ValueError``) before any call was announced is content from there on, as vLLM answers a malformed
call with plain text; once a call is out, what cannot be read is dropped, as vLLM's streaming parsers skip it: the
client keeps the calls it got (and the answer ends with ``finish_reason: "tool_calls"``), never their text again
as content. A whole (not streamed) answer with a call that cannot be read is all content (``answer``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvmesh.replica.openai.responses import random_id
from kvmesh.replica.openai.tool_parsers.base import ToolParser
from kvmesh.replica.serving.json_types import JSONObject

TOOL_CALL_ID_PREFIX = "chatcmpl-tool"
"""Tool call ids are ``chatcmpl-tool-<hex>`` (vLLM's)."""


def tool_call(call_id: str, name: str, arguments: str) -> JSONObject:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def answer(parser: ToolParser, text: str, parallel: bool = True) -> tuple[str | None, list[JSONObject]]:
    """(content, tool_calls) of a finished answer: its calls when every one is whole with JSON arguments, else the
    text as content and no calls (``parallel`` False keeps the first call only, as vLLM does)."""
    try:
        parsed = parser.parse(text, final=True)
    except ValueError:
        return text, []
    calls = parsed.calls if parallel else parsed.calls[:1]
    if not calls or not all(c.complete and c.name is not None and _is_json(c.arguments) for c in calls):
        return text, []
    return text[:parsed.content_end] or None, [tool_call(random_id(TOOL_CALL_ID_PREFIX), c.name, c.arguments)
                                               for c in calls]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class _SentCall:
    id: str
    arguments_sent: int = 0


class ToolCallStream:
    """The deltas of one streamed choice: ``feed`` each new piece of text, get what is new to send."""

    def __init__(self, parser: ToolParser, parallel: bool = True):
        self.parser = parser
        self.parallel = parallel
        self.text = ""
        self.content_sent = 0
        self.sent: list[_SentCall] = []
        self.unreadable = False

    @property
    def called(self) -> bool:
        """Whether a tool call has been announced."""
        return bool(self.sent)

    def feed(self, delta_text: str, final: bool = False) -> tuple[str, list[JSONObject]]:
        """(content delta, tool-call deltas) after ``delta_text`` (``final``: the last piece)."""
        self.text += delta_text
        if not self.unreadable:
            try:
                parsed = self.parser.parse(self.text, final)
            except ValueError:
                self.unreadable = True
        if self.unreadable:
            return ("" if self.called else self._content(len(self.text))), []
        calls = parsed.calls if self.parallel else parsed.calls[:1]
        deltas: list[JSONObject] = []
        for index, call in enumerate(calls):
            if call.name is None:
                break
            if index == len(self.sent):
                self.sent.append(_SentCall(random_id(TOOL_CALL_ID_PREFIX)))
                deltas.append({"index": index, **tool_call(self.sent[index].id, call.name, "")})
            sent = self.sent[index]
            new = call.arguments[sent.arguments_sent:]
            sent.arguments_sent = len(call.arguments)
            if not new:
                continue
            if deltas and deltas[-1]["index"] == index:
                deltas[-1]["function"]["arguments"] = new
            else:
                deltas.append({"index": index, "function": {"arguments": new}})
        return self._content(parsed.content_end), deltas

    def _content(self, end: int) -> str:
        new = self.text[self.content_sent:end] if end > self.content_sent else ""
        self.content_sent = max(self.content_sent, end)
        return new
