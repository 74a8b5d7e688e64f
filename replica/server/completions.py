"""The OpenAI completion endpoints of a replica: ``/v1/completions`` and ``/v1/chat/completions``.

Both run the same path, down once: validate the body -> render token ids off the loop (openai/renderer.py, the
router's rules; a kvmesh router sends them ready: a token-id ``prompt``, a chat's ``prompt_token_ids``, so the
replica only range-checks them) -> SamplingParams -> ``engine.generate`` (one engine request per choice and
prompt: parallel_sampling.py) -> the answer rendered from the engine's outputs (answer_renderer.py: one JSON
response, or SSE chunks then ``[DONE]``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request
from fastapi.responses import Response
from kvmesh.replica.openai import responses
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.compile_tenant import charge_compiles, compile_tenant
from kvmesh.replica.openai.grammar_limits import check_grammar_limits
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.openai.router_booking import router_booking
from kvmesh.replica.server import chat_answer, compile_seconds, kv_plane, kv_request, parallel_sampling
from kvmesh.replica.server.answer_renderer import AnswerRenderer
from kvmesh.replica.server.constraints import checked_constraints
from kvmesh.replica.server.engine_requests import engine_requests
from kvmesh.replica.server.kv_request import client_gone
from kvmesh.replica.serving.errors import ProtocolError, log_failure
from kvmesh.replica.serving.sampling_params import SamplingParamsError

if TYPE_CHECKING:
    from kvmesh.replica.server.state import ServerState

logger = logging.getLogger(__name__)

OpenAIRequest = CompletionRequest | ChatCompletionRequest
R = TypeVar("R", CompletionRequest, ChatCompletionRequest)


class OpenAIHandlers:
    """Request handlers bound to one engine client, tokenizer and model name (see app.py)."""

    def __init__(self, state: ServerState):
        self.state = state  # engine client, tokenizer, served names, metrics
        self.answers = AnswerRenderer(state)  # engine outputs -> OpenAI answers

    # ------------------------------------------------------------ entry points
    async def completions(self, http: Request) -> Response:
        req = await self._read(http, CompletionRequest)
        return await self._serve(http, req, await self.state.renderer.prompts(req))

    async def chat(self, http: Request) -> Response:
        return await self.serve_chat(http, await self._read(http, ChatCompletionRequest))

    async def serve_chat(self, http: Request, req: ChatCompletionRequest) -> Response:
        """Answer a validated chat request (``/v1/chat/completions``, and ``/v1/responses``' chat:
        responses_routes.py)."""
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

    def _count_load(self, http: Request, candidates: list[parallel_sampling.Candidate],
                    prompts: list[list[int]]) -> None:
        """The request is being queued: the load the replica publishes counts it from now on, booked on its router
        (load_publishing.py), not from its first output (``start_all`` waits for it: a router would see a replica
        computing a long prompt as idle until then). A request the engine then refuses is taken back
        (``_uncount_load``): its booking stays acknowledged, the router counts it no more."""
        if self.state.load_publishing is not None:
            booking = router_booking(http, self.state.server.internal_key)
            self.state.load_publishing.accept(booking, [c.request_id for c in candidates], len(prompts[0]))

    def _uncount_load(self, candidates: list[parallel_sampling.Candidate]) -> None:
        """The engine refused the request: out of the published load again (load_publishing.py ``refused``)."""
        if self.state.load_publishing is not None:
            self.state.load_publishing.refused([c.request_id for c in candidates])

    # ------------------------------------------------------------ shared path
    async def _serve(self, http: Request, req: OpenAIRequest, prompts: list[list[int]]) -> Response:
        """Start the request's engine requests, then render their answer (answer_renderer.py)."""
        client = self.state.engine_client
        params = parallel_sampling.params_per_prompt(req, prompts, client.max_model_len, self.state.default_max_tokens)
        chat_answer.constrain_after_reasoning(req, self.state.frontend, params)
        constraints = await checked_constraints(params)
        request_id = responses.random_id("chatcmpl" if isinstance(req, ChatCompletionRequest) else "cmpl")
        candidates, kv = engine_requests(self.state, http, req, request_id, prompts, params)
        self._count_load(http, candidates, prompts)  # from its queueing on, not its first output
        try:  # queues the requests now (a 400 before any byte is sent); a client leaving during a pull or a compile
            streams = await kv_request.start_or_leave(parallel_sampling.start_all(client, candidates),  # aborts them
                client_gone(http) if constraints or (kv is not None and kv.remote is not None) else None)
            headers = {**await kv_request.pull_headers(req, kv, streams),
                       **await compile_seconds.compile_headers(streams, bool(constraints))}
            if isinstance(req, CompletionRequest) and req.prompt_only:
                streams = [parallel_sampling.without_output(stream) for stream in streams]
        except ValueError as e:  # a SamplingParamsError names the field
            self._uncount_load(candidates)
            raise ProtocolError(str(e), param=e.param if isinstance(e, SamplingParamsError) else None) from None
        except RuntimeError as e:  # draining or broken: a router should retry elsewhere
            self._uncount_load(candidates)
            request_id = log_failure(e, logger, "a request was refused")
            raise ProtocolError(f"this replica cannot take requests now (draining, or its engine stopped; request id "
                                f"{request_id}); retry on another one", 503) from None
        answer_id = responses.answer_id(request_id, req.request_id)  # the engine's ids stay unique
        return await self.answers.respond(http, req, answer_id, candidates, streams, headers)
