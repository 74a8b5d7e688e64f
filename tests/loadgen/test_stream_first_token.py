"""A stream whose tokens bring no text (an EOS first; or bytes that never complete a character, which the
detokenizer holds back: the random-weights model answers 14 of 64 chatbot turns so) is a served request whose first
output came with the finishing chunk, not an error."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web
from kvmesh.cluster.measure.loadgen.client import RequestResult, send_streaming


def _sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
FINISH = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}


async def _stream(*chunks: dict) -> RequestResult:
    """What the load generator makes of a server answering every chat with ``chunks``."""
    async def chat(request: web.Request) -> web.Response:
        return web.Response(body=_sse(*chunks), content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as client:
            return await send_streaming(client, "/v1/chat/completions", {"stream": True}, RequestResult("s", 0), 0.0)
    finally:
        await runner.cleanup()


async def test_an_eos_first_stream_is_served_with_its_first_token_at_the_finish():
    result = await _stream(ROLE, FINISH, USAGE)
    assert result.ok and result.error == "" and result.ttft_s is not None
    assert result.completion_tokens == 1 and result.text == ""


async def test_a_stream_cut_before_any_token_or_finish_is_still_an_error():
    result = await _stream(ROLE, USAGE)
    assert not result.ok and result.error == "stream ended without any generated token"
