"""Load-generator test fixtures: a tiny fake OpenAI SSE server (FastAPI + uvicorn in a thread).

It streams ``max_tokens`` chunks ``token_delay_s`` apart and reports ``usage`` with
``prompt_tokens_details.cached_tokens`` from a toy prefix cache (16-token blocks of token-id
prompts, or words of text prompts), so cached shares are predictable.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

BLOCK = 16


class FakeState:
    def __init__(self, token_delay_s: float = 0.001, fail_every: int = 0):
        self.token_delay_s = token_delay_s
        self.fail_every = fail_every
        self.blocks: set = set()
        self.requests: list[dict] = []


def _units(body: dict) -> list:
    if "messages" in body:
        text = "\n".join(m["content"] for m in body["messages"])
        return text.split()
    prompt = body["prompt"]
    return list(prompt) if isinstance(prompt, list) else prompt.split()


def make_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        return {"count": len(_units(body))}

    async def complete(request: Request, chat: bool):
        body = await request.json()
        state.requests.append(body)
        if state.fail_every and len(state.requests) % state.fail_every == 0:
            return JSONResponse({"error": {"message": "injected failure", "type": "BadRequestError",
                                           "code": 400}}, status_code=400)
        units = _units(body)
        n_blocks = len(units) // BLOCK
        keys = [tuple(units[: (i + 1) * BLOCK]) for i in range(n_blocks)]
        cached = 0
        for k in keys:
            if k not in state.blocks:
                break
            cached += BLOCK
        state.blocks.update(keys)
        n = int(body.get("max_tokens", 16))

        async def stream():
            for i in range(n):
                await asyncio.sleep(state.token_delay_s)
                piece = f" w{i}"
                choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                          else {"index": 0, "text": piece, "finish_reason": None})
                yield f"data: {json.dumps({'id': 'x', 'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": len(units), "completion_tokens": n, "total_tokens": len(units) + n,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await complete(request, chat=True)

    return app


class FakeServer:
    """Context manager: ``with FakeServer() as srv: srv.url``."""

    def __init__(self, **kwargs):
        self.state = FakeState(**kwargs)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(make_app(self.state), host="127.0.0.1", port=self.port, log_level="error",
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


@pytest.fixture
def fake_server():
    with FakeServer() as srv:
        yield srv


@pytest.fixture
def make_fake_server():
    """Factory for servers with options (``fail_every``, ``token_delay_s``); closed at teardown."""
    servers = []

    def make(**kwargs) -> FakeServer:
        srv = FakeServer(**kwargs).__enter__()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.__exit__(None, None, None)
