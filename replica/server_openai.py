"""The OpenAI endpoints of a replica: ``/v1/completions`` and ``/v1/chat/completions``.

Both run the same path: validate the body -> render token ids off the loop (openai/renderer.py, the
router's rules)
-> SamplingParams -> ``EngineClient.generate`` -> one JSON response, or SSE chunks then ``[DONE]``.
A client that disconnects aborts its request (the engine frees its blocks); an error inside one
request fails that request only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from kvmesh.replica.openai import protocol as p
from kvmesh.replica.openai import responses as r
from kvmesh.replica.openai.errors import ProtocolError, error_body

logger = logging.getLogger(__name__)


def _usage(out: Any) -> r.UsageInfo:
    return r.UsageInfo.of(len(out.prompt_token_ids), len(out.output_token_ids), out.num_cached_tokens)


def _check_failed(out: Any) -> None:
    if out.finish_reason == "error":
        raise ProtocolError(f"request failed inside the engine: {out.error or 'unknown error'}", 500)


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client goes away (the ASGI receive channel says ``http.disconnect``)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def start_generation(client: Any, request_id: str, prompt_ids: list[int], params: Any,
                           cache_salt: str | None) -> AsyncIterator[Any]:
    """Queues the request and waits for its first output; returns the stream of all its outputs.

    So bad input raises ValueError (a 400) before any byte is sent, and a draining or broken
    replica raises RuntimeError (a 503 a router retries elsewhere).
    """
    reason = client.dead_reason()
    if reason is not None:
        raise RuntimeError(f"replica cannot take requests: {reason}")
    agen = client.generate(prompt_ids, params, request_id=request_id, cache_salt=cache_salt)
    try:
        first = await agen.__anext__()
    except BaseException:
        await agen.aclose()
        raise
    return _chain(first, agen)


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        yield first
        if first.finished:
            return
        async for out in rest:
            yield out
    finally:
        await rest.aclose()  # an early close aborts the request (AsyncLLM's rule)


class OpenAIHandlers:
    """Request handlers bound to one engine client, tokenizer and model name (see server.py)."""

    def __init__(self, state: Any):
        self.state = state  # server.ServerState: engine client, tokenizer, served names, metrics

    # ------------------------------------------------------------ entry points
    async def completions(self, http: Request) -> Any:
        req = await self.state.read_request(http, p.CompletionRequest)
        return await self._serve(http, req, await self.state.renderer.request(req), chat=False)

    async def chat(self, http: Request) -> Any:
        req = await self.state.read_request(http, p.ChatCompletionRequest)
        return await self._serve(http, req, await self.state.renderer.request(req), chat=True)

    # ------------------------------------------------------------ shared path
    async def _serve(self, http: Request, req: Any, prompt_ids: list[int], chat: bool) -> Any:
        client = self.state.engine_client
        params = req.to_sampling_params(len(prompt_ids), client.max_model_len, self.state.default_max_tokens)
        request_id = r.random_id("chatcmpl" if chat else "cmpl")
        try:  # queues the request now, so bad input is a 400 before any byte is sent
            stream = await start_generation(client, request_id, prompt_ids, params, req.cache_salt)
        except ValueError as e:
            raise ProtocolError(str(e)) from None
        except RuntimeError as e:  # draining or broken: a router should retry elsewhere
            raise ProtocolError(str(e), 503) from None
        model = req.model or self.state.model_name
        if req.stream:
            gen = self._stream_chat if chat else self._stream_completion
            return StreamingResponse(
                self._guard_stream(gen(request_id, model, stream, req, prompt_ids), request_id),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Request-Id": request_id},
            )
        final = await self._collect_or_abort(http, request_id, stream)
        _check_failed(final)
        usage = _usage(final)
        if chat:
            body = r.ChatCompletionResponse(
                id=request_id, model=model, usage=usage,
                choices=[r.ChatCompletionChoice(message=r.ChatMessageOut(content=final.text),
                                                finish_reason=final.finish_reason)])
        else:
            body = r.CompletionResponse(
                id=request_id, model=model, usage=usage,
                choices=[r.CompletionChoice(text=final.text, finish_reason=final.finish_reason)])
        return JSONResponse(body.model_dump(), headers={"X-Request-Id": request_id})

    async def _collect_or_abort(self, http: Request, request_id: str, stream: AsyncIterator[Any]) -> Any:
        """The final output; aborts the request if the client disconnects first."""

        async def collect() -> Any:
            last = None
            async for out in stream:
                last = out
            return last

        collect_task = asyncio.ensure_future(collect())
        disconnect_task = asyncio.ensure_future(_wait_disconnect(http))
        try:
            done, _ = await asyncio.wait({collect_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
            if collect_task not in done:
                logger.info("client disconnected; aborting %s", request_id)
                collect_task.cancel()
                await self.state.engine_client.abort(request_id)
                raise ProtocolError("client disconnected", 499)
            final = collect_task.result()
        finally:
            disconnect_task.cancel()
            if not collect_task.done():
                collect_task.cancel()
        if final is None:
            raise ProtocolError("the engine returned no output for this request", 500)
        return final

    async def _guard_stream(self, chunks: AsyncIterator[str], request_id: str) -> AsyncIterator[str]:
        """Abort on disconnect (Starlette cancels this generator) and turn errors into an SSE error event."""
        finished = False
        try:
            async for chunk in chunks:
                yield chunk
            finished = True
        except ProtocolError as e:
            finished = True
            yield r.sse(e.to_dict())
            yield r.SSE_DONE
        except Exception as e:  # noqa: BLE001 - one request's failure must not reach the server
            finished = True
            logger.exception("stream of %s failed", request_id)
            yield r.sse(error_body(f"internal error while streaming: {e!r}", 500))
            yield r.SSE_DONE
        finally:
            if not finished:
                logger.info("stream of %s closed early; aborting", request_id)
                await asyncio.shield(self.state.engine_client.abort(request_id))

    async def _stream_completion(self, request_id: str, model: str, stream: AsyncIterator[Any], req: Any,
                                 prompt_ids: list[int]):
        created = int(time.time())
        ids = req.return_token_ids  # then every step with new tokens is a chunk, even with no text yet
        first_ids = prompt_ids if ids else None  # sent once, on the first chunk
        async for out in stream:
            _check_failed(out)
            if not out.delta_text and not out.finished and not (ids and out.new_token_ids):
                continue
            chunk = r.CompletionChunk(
                id=request_id, created=created, model=model, prompt_token_ids=first_ids,
                choices=[r.CompletionChoice(text=out.delta_text, finish_reason=out.finish_reason,
                                            token_ids=out.new_token_ids if ids else None)],
                usage=_usage(out) if req.stream_options and req.stream_options.continuous_usage_stats else None)
            first_ids = None
            yield r.sse(chunk)
            if out.finished:
                if req.include_usage:
                    yield r.sse(r.CompletionChunk(id=request_id, created=created, model=model, choices=[],
                                                  usage=_usage(out)))
                break
        yield r.SSE_DONE

    async def _stream_chat(self, request_id: str, model: str, stream: AsyncIterator[Any], req: Any,
                           prompt_ids: list[int]):
        created = int(time.time())
        ids = req.return_token_ids  # then every step with new tokens is a chunk, even with no text yet

        def chunk(delta: r.DeltaMessage, finish_reason: str | None = None, usage=None, token_ids=None,
                  first_ids=None) -> str:
            return r.sse(r.ChatCompletionChunk(
                id=request_id, created=created, model=model, usage=usage, prompt_token_ids=first_ids,
                choices=[r.ChatStreamChoice(delta=delta, finish_reason=finish_reason,
                                            token_ids=token_ids if ids else None)]))

        yield chunk(r.DeltaMessage(role="assistant", content=""), token_ids=[], first_ids=prompt_ids if ids else None)
        async for out in stream:
            _check_failed(out)
            if not out.delta_text and not out.finished and not (ids and out.new_token_ids):
                continue
            usage = _usage(out) if req.stream_options and req.stream_options.continuous_usage_stats else None
            yield chunk(r.DeltaMessage(content=out.delta_text or None), out.finish_reason, usage, out.new_token_ids)
            if out.finished:
                if req.include_usage:
                    yield r.sse(r.ChatCompletionChunk(id=request_id, created=created, model=model,
                                                      choices=[], usage=_usage(out)))
                break
        yield r.SSE_DONE
