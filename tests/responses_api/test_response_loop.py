"""A Responses request's input becomes a chat off the event loop when it is long: 100,000 input items take seconds
to convert, and a server's loop (its probes of its replicas, every other tenant's request) must keep turning. Where
the conversion runs is read from the thread that runs it, not from timings a loaded machine would bend."""

from __future__ import annotations

import asyncio
import threading

import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from kvmesh.replica.openai.responses_api.service import INLINE_ITEMS, Answer, ResponsesService
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore

CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}


async def refuse(body: dict) -> Answer:
    return Answer(400, b'{"error": {"message": "too long", "type": "invalid_request_error"}}')


def conversion_thread(items: int, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Thread, threading.Thread]:
    """(the thread that converted a request of ``items`` input items to a chat, the event loop's thread)."""
    seen: list[threading.Thread] = []
    chat_body = ResponsesRequest.chat_body

    def watched(self, history):
        seen.append(threading.current_thread())
        return chat_body(self, history)

    monkeypatch.setattr(ResponsesRequest, "chat_body", watched)
    service = ResponsesService(SQLiteResponseStore(FrontendConfig()), lambda: "m")
    req = ResponsesRequest.model_validate({"input": [CALL] * items})

    async def main() -> threading.Thread:
        answer = await service.create(req, "ann", refuse)
        assert answer.status == 400
        return threading.current_thread()

    try:
        loop_thread = asyncio.run(main())
    finally:
        service.close()
    assert len(seen) == 1
    return seen[0], loop_thread


def test_a_long_input_is_converted_off_the_loop(monkeypatch):
    converted_on, loop_thread = conversion_thread(100_000, monkeypatch)
    assert converted_on is not loop_thread


def test_a_short_input_is_converted_on_the_loop(monkeypatch):
    converted_on, loop_thread = conversion_thread(INLINE_ITEMS, monkeypatch)
    assert converted_on is loop_thread
