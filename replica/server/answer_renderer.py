"""A request's engine outputs -> its OpenAI answer, rendered in one place (the handlers start the engine requests
and hand them here once: completions.py).

Each choice's text is shaped in one order, whole or streamed, for chats (chat_render.py) and completions
(completion_render.py) alike:

    reasoning -> tools -> logprobs -> usage
    (chat_answer.py: the reasoning parser, then the tool parser on the answer after it; logprobs_format.py in
    vLLM's shapes; output_usage.py: vLLM's counting for n / best_of / batches of prompts)

    whole    every candidate's final output -> the chosen choices -> the usage -> the prompt logprobs (and a
             finished prefill's ``kv_transfer_params``): one JSON response
    stream   per engine output one chunk (the usage in it with ``continuous_usage_stats``) -> one usage chunk
             (``include_usage``) -> ``[DONE]``; an error after the first byte ends it with an SSE error event

A client that disconnects aborts its requests (the engine frees their blocks); an error inside one request fails
that request only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from kvmesh.replica.openai import logprobs_format, responses
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.server import kv_request, parallel_sampling
from kvmesh.replica.server.answer import RenderedAnswer
from kvmesh.replica.server.chat_render import ChatAnswer
from kvmesh.replica.server.completion_render import CompletionAnswer
from kvmesh.replica.server.kv_request import client_gone
from kvmesh.replica.server.output_usage import check_failed, total_usage
from kvmesh.replica.server.parallel_sampling import Candidate, Outputs
from kvmesh.replica.serving.errors import ProtocolError, internal_error
from kvmesh.replica.step.outputs import RequestOutput

if TYPE_CHECKING:
    from kvmesh.replica.server.state import ServerState

logger = logging.getLogger(__name__)


class AnswerRenderer:
    """Renders every answer of one replica (see app.py): its token strings and echoed prompts from the replica's
    tokenizer, its aborts on the replica's engine."""

    def __init__(self, state: ServerState):
        self.state = state  # engine client, tokenizer, served names, frontend options
        self.token_strings = logprobs_format.TokenStrings(state.tokenizer)  # for logprobs' token strings

    async def respond(self, http: Request, req: CompletionRequest | ChatCompletionRequest, request_id: str,
                      candidates: list[Candidate], streams: list[Outputs], headers: dict[str, str]) -> Response:
        """The answer to ``req`` from its started ``streams`` (``headers``: the ones it carries besides its id)."""
        kind = ChatAnswer if isinstance(req, ChatCompletionRequest) else CompletionAnswer
        answer = kind(req, request_id, req.model or self.state.model_name, candidates, self.state.frontend,
                      self.state.tokenizer, self.token_strings)
        if req.stream:
            return StreamingResponse(
                self._guard_stream(self._sse(answer, streams), candidates),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Request-Id": responses.id_header(request_id), **headers},
            )
        finals = await self._collect_or_abort(http, candidates, streams)
        for final in finals:
            check_failed(final)
        payload = self._payload(answer, finals)
        if (handle := kv_request.handle(req, finals[0])) is not None:
            payload["kv_transfer_params"] = handle
        return JSONResponse(payload, headers={"X-Request-Id": responses.id_header(request_id), **headers})

    @staticmethod
    def _payload(answer: RenderedAnswer, finals: list[RequestOutput]) -> dict:
        """The whole answer as JSON: the choices (the kind's) -> the usage -> the prompt logprobs."""
        usage = total_usage(answer.candidates, finals)
        chosen = parallel_sampling.select_choices(answer.candidates, finals, answer.req.n)
        payload = answer.body(chosen, finals, usage).model_dump()
        logprobs_format.attach_prompt_logprobs(payload, answer.req.prompt_logprobs,
                                               parallel_sampling.prompt_logprobs_of(answer.candidates, finals),
                                               [c.prompt_index for _, c, _ in chosen], answer.decode())
        return payload

    @staticmethod
    async def _sse(answer: RenderedAnswer, streams: list[Outputs]) -> AsyncIterator[str]:
        """Every choice's chunks as they come (the kind's), then (``include_usage``) one usage chunk, then
        ``[DONE]``."""
        created = int(time.time())
        finals: list[RequestOutput | None] = [None] * len(answer.candidates)  # filled in by the chunks
        async for chunk in answer.chunks(created, streams, finals):
            yield chunk
        done = [f for f in finals if f is not None]
        if answer.req.include_usage and len(done) == len(finals):
            yield responses.sse(answer.chunk_class(id=answer.request_id, created=created, model=answer.model,
                                                   choices=[], usage=total_usage(answer.candidates, done)))
        yield responses.SSE_DONE

    async def _collect_or_abort(self, http: Request, candidates: list[Candidate],
                                stream_list: list[Outputs]) -> list[RequestOutput]:
        """Every candidate's final output; aborts them all if the client disconnects first."""
        collect_task = asyncio.ensure_future(parallel_sampling.collect_all(stream_list))
        disconnect_task = asyncio.ensure_future(client_gone(http))
        try:
            done, _ = await asyncio.wait({collect_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
            if collect_task not in done:
                logger.info("client disconnected; aborting %s", candidates[0].request_id)
                collect_task.cancel()
                for c in candidates:
                    await self.state.engine_client.abort(c.request_id)
                raise ProtocolError("client disconnected", 499)
            finals = collect_task.result()
        finally:
            disconnect_task.cancel()
            if not collect_task.done():
                collect_task.cancel()
        if any(f is None for f in finals):
            raise ProtocolError("the engine returned no output for this request", 500)
        return [f for f in finals if f is not None]

    async def _guard_stream(self, chunks: AsyncIterator[str], candidates: list[Candidate]) -> AsyncIterator[str]:
        """Abort on disconnect (Starlette cancels this generator) and turn errors into an SSE error event."""
        finished = False
        request_id = candidates[0].request_id
        try:
            async for chunk in chunks:
                yield chunk
            finished = True
        except ProtocolError as e:
            finished = True
            yield responses.sse(e.to_dict())
            yield responses.SSE_DONE
        except Exception as e:  # noqa: BLE001 - one request's failure must not reach the server
            finished = True
            yield responses.sse(internal_error("replica", e, logger, what=f"stream of {request_id} failed").to_dict())
            yield responses.SSE_DONE
        finally:
            if not finished:
                logger.info("stream of %s closed early; aborting", request_id)
                for c in candidates:
                    await asyncio.shield(self.state.engine_client.abort(c.request_id))
