"""A Responses request's input becomes a chat off the event loop when it is long: 100,000 input items take seconds
to convert, and a server's loop (its probes of its replicas, every other tenant's request) must keep turning."""

from __future__ import annotations

import asyncio
import time

from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from kvmesh.replica.openai.responses_api.service import Answer, ResponsesService
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore

CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
SHARE = 3
"""The loop may stop turning for at most 1/SHARE of what converting the input takes (on it, the whole of it: 1-10 s
by the machine's load; on a thread, the collector's pauses and the GIL's turns: a tenth of it)."""


def test_a_long_input_is_converted_off_the_loop():
    service = ResponsesService(SQLiteResponseStore(FrontendConfig()), lambda: "m")
    req = ResponsesRequest.model_validate({"input": [CALL] * 100_000})
    t0 = time.monotonic()
    req.chat_body([]), req.input_messages()
    converting = time.monotonic() - t0

    async def refuse(body: dict) -> Answer:
        return Answer(400, b'{"error": {"message": "too long", "type": "invalid_request_error"}}')

    async def main() -> float:
        gaps, done = [0.0], asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        answer = await service.create(req, "ann", refuse)
        done.set()
        await tick
        assert answer.status == 400
        return max(gaps)

    try:
        gap = asyncio.run(main())
        assert gap < converting / SHARE, f"the loop stopped for {gap:.2f}s; converting takes {converting:.2f}s"
    finally:
        service.close()
