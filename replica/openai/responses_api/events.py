"""A streamed chat answer's chunks as the Responses API's server-sent events, in OpenAI's order.

    response.created, response.in_progress
    per output item, in the order the answer writes them:
        response.output_item.added
        text:      response.content_part.added, response.output_text.delta ..., response.output_text.done,
                   response.content_part.done
        reasoning: response.reasoning_text.delta ..., response.reasoning_text.done (a reasoning parser's
                   ``reasoning`` / ``reasoning_content`` deltas)
        call:      response.function_call_arguments.delta ..., response.function_call_arguments.done
        response.output_item.done (the last item ``incomplete`` when max_output_tokens cut it)
    response.completed (or response.incomplete at max_output_tokens, and for a cancelled answer: status
    "cancelled", OpenAI having no event of its own for it)
    on an error: error, then response.failed; a choice that ends with its own error (``finish_reason: "error"``
    with the request's ``error``, a 4xx) fails with that error, as the unstreamed request's 400

Each event is ``event: <type>`` and ``data: <json>`` with a rising ``sequence_number``; there is no ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from kvmesh.replica.serving.json_types import JSONObject

from .output import (
    finished,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    reasoning_of,
    status_of,
    text_part,
)


def sse_event(event: JSONObject) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[JSONObject]:
    """The JSON objects of a chat stream's ``data:`` lines (``[DONE]`` ends it), however its bytes are cut."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    yield json.loads(data)


class ResponseEvents:
    """Turns one chat stream into the events of one Response (module doc): ``start``, ``chunk`` per chat chunk,
    then ``finish`` or ``fail``; ``response`` is the Response so far."""

    def __init__(self, response: JSONObject) -> None:
        self.response = response
        self.output: list[JSONObject] = []
        """The output items, each filled in as its deltas arrive."""
        self.sequence = 0
        self.finish_reason: str | None = None
        self.usage: JSONObject | None = None
        self._open: JSONObject | None = None
        self._calls: dict[int, JSONObject] = {}
        """The chat's tool-call index -> its function_call item."""
        self.client_error: JSONObject | None = None
        """The request's own error a choice ended with (``fail`` it); None: none."""

    def _event(self, kind: str, **fields) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(event)

    def start(self) -> list[bytes]:
        return [self._event("response.created", response=self.response),
                self._event("response.in_progress", response=self.response)]

    def chunk(self, chunk: JSONObject) -> list[bytes]:
        """The events of one chat chunk."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: list[bytes] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if reasoning := reasoning_of(delta):
                events += self._text("reasoning", str(reasoning))
            if content := delta.get("content"):
                events += self._text("message", content)
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                error = choice.get("error")
                if choice["finish_reason"] == "error" and isinstance(error, dict):
                    self.client_error = error
        return events

    def _text(self, kind: str, text: str) -> list[bytes]:
        events = []
        item = self._open
        if item is None or item["type"] != kind:
            events += self._close()
            item = reasoning_item("", "in_progress") if kind == "reasoning" else message_item("", "in_progress")
            events += self._add(item)
        item["content"][0]["text"] += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        events.append(self._event(name, item_id=item["id"], output_index=len(self.output) - 1, content_index=0,
                                  delta=text, **extra))
        return events

    def _call(self, call: JSONObject) -> list[bytes]:
        events = []
        index = call.get("index", 0)
        function = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            events += self._close()
            item = function_call_item(call.get("id") or new_id("call"), function.get("name", ""), "",
                                        "in_progress")
            self._calls[index] = item
            events += self._add(item)
        if arguments := function.get("arguments"):
            item["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self.output.index(item), delta=arguments))
        return events

    def _add(self, item: JSONObject) -> list[bytes]:
        self.output.append(item)
        self._open = item
        index = len(self.output) - 1
        events = [self._event("response.output_item.added", output_index=index, item=item)]
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                      content_index=0, part=text_part("")))
        return events

    def _close(self, status: str = "completed") -> list[bytes]:
        """The done events of the open item (its text or arguments complete; ``status``: "incomplete" when it was
        cut)."""
        item, self._open = self._open, None
        if item is None:
            return []
        index, events = self.output.index(item), []
        if item["type"] == "message":
            part = item["content"][0]
            events.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=part["text"], logprobs=[]))
            events.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                      content_index=0, part=part))
        elif item["type"] == "reasoning":
            events.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=item["content"][0]["text"]))
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, name=item["name"], arguments=item["arguments"]))
        item["status"] = status
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def finish(self) -> list[bytes]:
        """The done events of every open item; ``response`` is then the finished Response (``completed`` sends it)."""
        last = "incomplete" if status_of(self.finish_reason)[0] == "incomplete" else "completed"
        events = self._close(last)
        if not self.output:  # an answer with no text at all is still one (empty) message, as a whole answer is
            events += self._add(message_item("", "in_progress"))
            events += self._close(last)
        self.response = finished(self.response, self.output, self.finish_reason, self.usage)
        return events

    def completed(self) -> bytes:
        """The last event: ``response.completed`` (or ``response.incomplete`` at max_output_tokens) with
        ``response``."""
        kind = {"completed": "response.completed", "failed": "response.failed"}.get(self.response["status"],
                                                                                  "response.incomplete")
        return self._event(kind, response=self.response)

    def fail(self, error: JSONObject) -> list[bytes]:
        """An ``error`` event with the chat's error (``{"message", "code", "type"?, "param"?}``: the event's ``code``
        is its type when it has one), then ``response.failed`` (its ``error.code`` one of OpenAI's:
        ``rate_limit_exceeded`` for a 429, ``invalid_prompt`` for another 4xx, else ``server_error``)."""
        code, message = error.get("code"), str(error.get("message", ""))
        status = code if isinstance(code, int) else 500
        kind = "rate_limit_exceeded" if status == 429 else "invalid_prompt" if 400 <= status < 500 else "server_error"
        self.response = {**self.response, "status": "failed", "output": self.output,
                         "error": {"code": kind, "message": message}}
        name = error.get("type") if isinstance(error.get("type"), str) else None if code is None else str(code)
        return [self._event("error", code=name, message=message, param=error.get("param")),
                self._event("response.failed", response=self.response)]
