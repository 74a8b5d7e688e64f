"""The OpenAI completion endpoints of a replica: ``/v1/completions`` and ``/v1/chat/completions``.

Both run the same path: validate the body -> render token ids off the loop (openai/renderer.py, the
router's rules; a kvmesh router sends them ready: a token-id ``prompt``, a chat's ``prompt_token_ids``,
so the replica only range-checks them) -> SamplingParams -> ``engine.generate`` (one engine request per choice and prompt:
parallel_sampling.py) -> one JSON response, or SSE chunks then ``[DONE]``; logprobs in vLLM's shapes
(openai/logprobs_format.py).
A client that disconnects aborts its request (the engine frees its blocks); an error inside one
request fails that request only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from kvmesh.replica.openai import logprobs_format, responses
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.compile_tenant import charge_compiles, compile_tenant
from kvmesh.replica.openai.grammar_limits import check_grammar_limits
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.openai.router_booking import router_booking
from kvmesh.replica.server import chat_answer, compile_seconds, kv_plane, kv_request, parallel_sampling
from kvmesh.replica.server.constraints import checked_constraints
from kvmesh.replica.server.engine_requests import engine_requests
from kvmesh.replica.server.kv_request import client_gone
from kvmesh.replica.server.output_usage import check_failed, own_error, total_usage, usage_of
from kvmesh.replica.server.parallel_sampling import Outputs
from kvmesh.replica.serving.errors import ProtocolError, internal_error, log_failure
from kvmesh.replica.serving.sampling_params import SamplingParamsError
from kvmesh.replica.step.outputs import PromptLogprobs, RequestOutput, TokenLogprobs

if TYPE_CHECKING:
    from kvmesh.replica.server.state import ServerState

logger = logging.getLogger(__name__)

OpenAIRequest = CompletionRequest | ChatCompletionRequest
R = TypeVar("R", CompletionRequest, ChatCompletionRequest)


class OpenAIHandlers:
    """Request handlers bound to one engine client, tokenizer and model name (see app.py)."""

    def __init__(self, state: ServerState):
        self.state = state  # engine client, tokenizer, served names, metrics
        self._token_decoder: logprobs_format.TokenDecoder | None = None  # for logprobs' token strings

    # ------------------------------------------------------------ entry points
    async def completions(self, http: Request) -> Response:
        req = await self._read(http, CompletionRequest)
        return await self._serve(http, req, await self.state.renderer.prompts(req))

    async def chat(self, http: Request) -> Response:
        return await self.serve_chat(http, await self._read(http, ChatCompletionRequest))

    async def serve_chat(self, http: Request, req: ChatCompletionRequest) -> Response:
        """Answer a validated chat request (``/v1/chat/completions``, and ``/v1/responses``' chat: responses_routes.py)."""
        return await self._serve(http, req, [await self.state.renderer.request(req)])

    async def _read(self, http: Request, model_cls: type[R]) -> R:
        """The body validated into ``model_cls`` (limits applied while reading), for the served model;
        ``kv_transfer_params`` only from the cluster itself (kv_plane.py), before kv_request.py acts on them."""
        req = await read_request(http, model_cls, self.state.frontend, self.state.renderer.run)
        self.state.check_model(req.model)
        check_grammar_limits(req, self.state.frontend)
        kv_plane.check_transfer_params(self.state.server, http, req)
        charge_compiles(req, compile_tenant(http, self.state.server.internal_key))
        router_booking(http, self.state.server.internal_key)  # a 403 from anyone but the router, before any work
        return req

    def _count_load(self, http: Request, candidates: list[parallel_sampling.Candidate], prompts: list[list[int]]) -> None:
        """The request is queued: the load the replica publishes counts it, booked on its router (load_publishing.py)."""
        if self.state.load_publishing is not None:
            booking = router_booking(http, self.state.server.internal_key)
            self.state.load_publishing.accept(booking, [c.request_id for c in candidates], len(prompts[0]))

    # ------------------------------------------------------------ shared path
    async def _serve(self, http: Request, req: OpenAIRequest, prompts: list[list[int]]) -> Response:
        client = self.state.engine_client
        params = parallel_sampling.params_per_prompt(req, prompts, client.max_model_len, self.state.default_max_tokens)
        chat_answer.constrain_after_reasoning(req, self.state.frontend, params)
        constraints = await checked_constraints(params)
        request_id = responses.random_id("chatcmpl" if isinstance(req, ChatCompletionRequest) else "cmpl")
        candidates, kv = engine_requests(self.state, http, req, request_id, prompts, params)
        try:  # queues the requests now (a 400 before any byte is sent); a client leaving during a pull or a compile
            streams = await kv_request.start_or_leave(parallel_sampling.start_all(client, candidates),  # aborts them
                client_gone(http) if constraints or (kv is not None and kv.remote is not None) else None)
            kv_headers = {**await kv_request.pull_headers(req, kv, streams),  **await compile_seconds.compile_headers(streams, bool(constraints))}
            if isinstance(req, CompletionRequest) and req.prompt_only:
                streams = [parallel_sampling.without_output(stream) for stream in streams]
            self._count_load(http, candidates, prompts)
        except ValueError as e:  # a SamplingParamsError names the field
            raise ProtocolError(str(e), param=e.param if isinstance(e, SamplingParamsError) else None) from None
        except RuntimeError as e:  # draining or broken: a router should retry elsewhere
            request_id = log_failure(e, logger, "a request was refused")
            raise ProtocolError(f"this replica cannot take requests now (draining, or its engine stopped; request id "
                                f"{request_id}); retry on another one", 503) from None
        model = req.model or self.state.model_name
        request_id = responses.answer_id(request_id, req.request_id)  # the engine's ids stay unique
        if req.stream:
            return StreamingResponse(
                self._guard_stream(self._stream(request_id, model, candidates, streams, req), candidates),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Request-Id": responses.id_header(request_id), **kv_headers},
            )
        finals = await self._collect_or_abort(http, candidates, streams)
        for final in finals:
            check_failed(final)
        usage = total_usage(candidates, finals)
        choices = parallel_sampling.select_choices(candidates, finals, req.n)
        body: responses.ChatCompletionResponse | responses.CompletionResponse
        if isinstance(req, ChatCompletionRequest):
            answers = [chat_answer.message(req, self.state.frontend, final.text, final.finish_reason)
                       for _, _, final in choices]
            body = responses.ChatCompletionResponse(id=request_id, model=model, usage=usage, choices=[
                responses.ChatCompletionChoice(index=index, message=message, finish_reason=reason,
                                       logprobs=self._chat_logprobs(req, final.output_token_ids, final.logprobs))
                for (index, _, final), (message, reason) in zip(choices, answers, strict=True)])
        else:
            prompt_logprobs = parallel_sampling.prompt_logprobs_of(candidates, finals)
            body = responses.CompletionResponse(id=request_id, model=model, usage=usage, choices=[
                self._completion_choice(req, index, final, candidate, prompt_logprobs.get(candidate.prompt_index))
                for index, candidate, final in choices])
        payload = body.model_dump()
        logprobs_format.attach_prompt_logprobs(payload, req.prompt_logprobs, parallel_sampling.prompt_logprobs_of(candidates, finals),
                                  [c.prompt_index for _, c, _ in choices], self._decode_token(req))
        if (handle := kv_request.handle(req, finals[0])) is not None:
            payload["kv_transfer_params"] = handle
        return JSONResponse(payload, headers={"X-Request-Id": responses.id_header(request_id), **kv_headers})

    # ------------------------------------------------------------ logprobs (openai/logprobs_format.py)
    def _decode_token(self, req: OpenAIRequest) -> logprobs_format.TokenDecoder:
        """One token alone -> its text (built on first use; caches what it decoded), or its id as text."""
        if self._token_decoder is None:
            self._token_decoder = logprobs_format.token_decoder(self.state.tokenizer.hf)
        return logprobs_format.token_id_text if req.return_tokens_as_token_ids else self._token_decoder

    def _echo_text(self, req: CompletionRequest, out: RequestOutput, prompt_index: int) -> str:
        """The echoed prompt: as sent when it was text (and not truncated), else the tokens it ran decoded."""
        prompt, cut = req.prompts()[prompt_index], req.truncate_prompt_tokens is not None
        return prompt if isinstance(prompt, str) and not cut else self.state.tokenizer.decode(out.prompt_token_ids)

    def _completion_choice(self, req: CompletionRequest, index: int, final: RequestOutput, candidate: parallel_sampling.Candidate,
                           prompt_logprobs: PromptLogprobs | None) -> responses.CompletionChoice:
        text = self._echo_text(req, final, candidate.prompt_index) + final.text if req.echo else final.text
        logprobs = None if req.logprobs is None else logprobs_format.choice_logprobs(
            final.prompt_token_ids, prompt_logprobs, final.output_token_ids, final.logprobs, req.logprobs,
            self._decode_token(req), req.echo)
        return responses.CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=final.finish_reason)

    def _chat_logprobs(self, req: ChatCompletionRequest, token_ids: list[int],
                       entries: list[TokenLogprobs] | None) -> dict | None:
        if not req.logprobs or entries is None or req.hides_reasoning(self.state.frontend.reasoning_parser):
            return None
        return logprobs_format.chat_logprobs(token_ids, entries, req.top_logprobs or 0, self._decode_token(req))

    async def _collect_or_abort(self, http: Request, candidates: list[parallel_sampling.Candidate],
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

    async def _guard_stream(self, chunks: AsyncIterator[str], candidates: list[parallel_sampling.Candidate]) -> AsyncIterator[str]:
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

    async def _stream(self, request_id: str, model: str, candidates: list[parallel_sampling.Candidate], stream_list: list[Outputs],
                      req: OpenAIRequest) -> AsyncIterator[str]:
        """Every choice's chunks as they come, then (``include_usage``) one usage chunk, then ``[DONE]``."""
        created = int(time.time())
        finals: list[RequestOutput | None] = [None] * len(candidates)  # filled in by the chunk generators
        usage_chunk: type[responses.ChatCompletionChunk] | type[responses.CompletionChunk]
        if isinstance(req, ChatCompletionRequest):
            chunks = self._chat_chunks(request_id, created, model, candidates, stream_list, req, finals)
            usage_chunk = responses.ChatCompletionChunk
        else:
            chunks = self._completion_chunks(request_id, created, model, candidates, stream_list, req, finals)
            usage_chunk = responses.CompletionChunk
        async for chunk in chunks:
            yield chunk
        done = [f for f in finals if f is not None]
        if req.include_usage and len(done) == len(finals):
            yield responses.sse(usage_chunk(id=request_id, created=created, model=model, choices=[],
                                    usage=total_usage(candidates, done)))
        yield responses.SSE_DONE

    async def _completion_chunks(self, request_id: str, created: int, model: str, candidates: list[parallel_sampling.Candidate],
                                 stream_list: list[Outputs], req: CompletionRequest,
                                 finals: list[RequestOutput | None]) -> AsyncIterator[str]:
        continuous = req.stream_options and req.stream_options.continuous_usage_stats
        ids = req.return_token_ids  # then every step with new tokens is a chunk, even with no text yet
        first_ids = [ids] * len(candidates)  # prompt ids go once, on each choice's first chunk
        text_offsets = [0] * len(candidates)  # characters of each choice's logprobs tokens sent so far
        echoed = [not req.echo] * len(candidates)
        async for i, out in parallel_sampling.merge_streams(stream_list, req.stream_interval):
            check_failed(out, stream=True)
            if not (out.delta_text or out.finished or out.new_logprobs or not echoed[i] or (ids and out.new_token_ids)):
                continue
            text, logprobs, echo = out.delta_text, None, not echoed[i]
            if echo:
                text, echoed[i] = self._echo_text(req, out, candidates[i].prompt_index) + text, True
            if req.logprobs is not None:
                logprobs = logprobs_format.choice_logprobs(
                    out.prompt_token_ids, out.prompt_logprobs, out.new_token_ids,
                    out.new_logprobs or [None] * len(out.new_token_ids), req.logprobs, self._decode_token(req), echo,
                    text_offsets[i])
                text_offsets[i] += sum(map(len, logprobs["tokens"]))
            chunk = responses.CompletionChunk(
                id=request_id, created=created, model=model,
                prompt_token_ids=candidates[i].request.prompt_token_ids if first_ids[i] else None,
                choices=[responses.CompletionChoice(index=parallel_sampling.choice_index(candidates[i], req.n), text=text,
                                            logprobs=logprobs, finish_reason=out.finish_reason,
                                            token_ids=out.new_token_ids if ids else None)],
                usage=usage_of(out) if continuous else None)
            first_ids[i] = False
            yield responses.sse(chunk)
            if out.finished:
                finals[i] = out

    async def _chat_chunks(self, request_id: str, created: int, model: str, candidates: list[parallel_sampling.Candidate],
                           stream_list: list[Outputs], req: ChatCompletionRequest,
                           finals: list[RequestOutput | None]) -> AsyncIterator[str]:
        continuous = req.stream_options and req.stream_options.continuous_usage_stats
        hidden = req.hides_reasoning(self.state.frontend.reasoning_parser)  # no token ids or logprobs then
        ids = req.return_token_ids and not hidden  # then every step with new tokens is a chunk, even with no text yet

        def chunk(index: int, delta: responses.DeltaMessage, finish_reason: str | None = None, usage: responses.UsageInfo | None = None,
                  logprobs: dict | None = None, token_ids: list[int] | None = None,
                  first_ids: list[int] | None = None, error: dict | None = None) -> str:
            return responses.sse(responses.ChatCompletionChunk(
                id=request_id, created=created, model=model, usage=usage, prompt_token_ids=first_ids,
                choices=[responses.ChatStreamChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason,
                                            token_ids=token_ids if ids else None, error=error)]))

        for c in candidates:
            yield chunk(parallel_sampling.choice_index(c, req.n), responses.DeltaMessage(role="assistant", content=req.echo_text()), token_ids=[],
                        first_ids=c.request.prompt_token_ids if ids else None)
        readers = chat_answer.streams(req, self.state.frontend, len(candidates))
        async for i, out in parallel_sampling.merge_streams(stream_list, req.stream_interval):
            check_failed(out, stream=True)
            if not out.delta_text and not out.finished and not out.new_logprobs and not (ids and out.new_token_ids):
                continue
            delta, reason = chat_answer.delta(req, readers[i], out.delta_text, out.finish_reason)
            if delta is None and (hidden or not out.new_logprobs) and not (ids and out.new_token_ids):
                continue  # text a reader holds back
            usage = usage_of(out) if continuous else None
            logprobs = self._chat_logprobs(req, out.new_token_ids, out.new_logprobs)
            yield chunk(parallel_sampling.choice_index(candidates[i], req.n), delta or responses.DeltaMessage(content=""),
                        reason, usage, logprobs, out.new_token_ids, error=own_error(out))
            if out.finished:
                finals[i] = out
