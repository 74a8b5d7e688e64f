"""The fake replica's answers as bytes (fake_replica.py writes them): an HTTP/1.1 head, a JSON body, and a
completion, non-streamed or as SSE chunks in chunked transfer encoding, in OpenAI's shapes.
"""

from __future__ import annotations

import functools
import json
from http import HTTPStatus

JSONBody = dict[str, object]
"""A request or response body as JSON decodes it (OpenAI bodies are open-ended)."""


def http_head(status: int, length: int | None, content_type: bytes = b"application/json") -> bytes:
    size = b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s\r\n\r\n" % (status, HTTPStatus(status).phrase.encode(),
                                                                  content_type, size)


def json_answer(status: int, body: JSONBody) -> bytes:
    data = json.dumps(body).encode()
    return http_head(status, len(data)) + data


@functools.lru_cache(maxsize=4096)
def completion_answer(chat: bool, stream: bool, with_usage: bool, model: str, name: str, pieces: tuple[str, ...],
                      prompt_tokens: int, cached: int) -> tuple[bytes, ...]:
    """A completion's bytes: (head, one chunk per piece, tail); not streamed, all in the head (memoized: the
    same answer costs a lookup, so a router in front of the fake is measured almost alone)."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces),
             "total_tokens": prompt_tokens + len(pieces), "prompt_tokens_details": {"cached_tokens": cached}}
    kind = "chat.completion" if chat else "text_completion"
    if not stream:
        choice = ({"index": 0, "message": {"role": "assistant", "content": name}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": name, "logprobs": None, "finish_reason": "length"})
        return json_answer(200, {"id": "cmpl-fake", "object": kind, "created": 0, "model": model,
                                 "choices": [choice], "usage": usage}), b""

    def event(payload: JSONBody) -> bytes:
        data = b"data: " + json.dumps(payload).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    last = len(pieces) - 1  # the last piece carries the finish reason, as a real server's last chunk does
    chunks = [event({"id": "cmpl-fake", "object": kind + ".chunk" * chat, "model": model, "choices": [
        {"index": 0, "delta": {"content": piece}, "finish_reason": "length" if i == last else None} if chat
        else {"index": 0, "text": piece, "finish_reason": "length" if i == last else None}]})
        for i, piece in enumerate(pieces)]
    tail = (event({"id": "cmpl-fake", "choices": [], "usage": usage}) if with_usage else b"")
    done = b"data: [DONE]\n\n"
    return (http_head(200, None, b"text/event-stream"), *chunks,
            tail + b"%x\r\n%s\r\n" % (len(done), done) + b"0\r\n\r\n")


def garbage_answer(stream: bool) -> bytes:
    """A 200 whose body is not what was asked for: plain text, or an SSE stream of non-JSON events."""
    if not stream:
        return http_head(200, 24, b"application/json") + b"<html>bad gateway</html>"
    data = b"data: garbage\n\ndata: [DONE]\n\n"
    return http_head(200, None, b"text/event-stream") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
