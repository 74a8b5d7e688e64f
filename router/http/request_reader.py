"""A proxied request read: its body validated and its prompts rendered and tokenized exactly as the replica will,
its ``"model"``'s pool, its tenant and priority (caller.py), a stream's migration state (migration.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvmesh.replica.openai.body import decode_off_loop
from kvmesh.replica.openai.grammar_limits import check_grammar_limits
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.serving.json_types import JSONObject
from kvmesh.router.http.caller import identify
from kvmesh.router.http.messages import HttpRequest
from kvmesh.router.http.migration import MigratingStream
from kvmesh.router.http.proxy_request import ProxyRequest
from kvmesh.router.http.router_only import refuse_router_only, refuse_router_only_headers
from kvmesh.router.routing.receipts import HEADER_OPT_IN

if TYPE_CHECKING:
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.router.http.data_plane import DataPlane
    from kvmesh.router.routing.model_pools import ModelPool

OpenAIRequest = CompletionRequest | ChatCompletionRequest
"""A validated body of one of the two proxied paths."""
SESSION_HEADER = b"x-session-id"
"""Request header naming a conversation/agent session (else the body's ``user``): soft affinity."""
HEADER_OPT_IN_BYTES = HEADER_OPT_IN.encode()


class RequestReader:
    """Turns a client's request into a ``ProxyRequest`` (and, for benchmarks and tests, a body into token ids)."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def parse(self, raw: bytes, chat: bool) -> tuple[OpenAIRequest, list[int]]:
        """Validate the body and render its prompts exactly as the replica will (ProtocolError on bad input);
        the token ids to route by (a batch of prompts goes to one replica, by its first prompt)."""
        _, req, prompts = await self.parse_prompts(raw, chat)
        return req, prompts[0] if prompts else []

    async def parse_prompts(self, raw: bytes, chat: bool) -> tuple[JSONObject, OpenAIRequest, list[list[int]]]:
        """``parse``, with the body's JSON object and the token ids of every prompt of the request (none without a
        tokenizer)."""
        body, req, prompts, _, _ = await self._validate(raw, chat)
        return body, req, prompts

    async def _validate(self, raw: bytes, chat: bool) -> tuple[JSONObject, OpenAIRequest, list[list[int]],
                                                                SamplingParams | None, ModelPool | None]:
        """The body's JSON object (decoded once) and that object validated, the token ids of its prompts (by its
        model's tokenizer), the first prompt's sampling parameters, each prompt checked against the context as the
        replica checks it, and the pool its ``"model"`` picks (router/routing/model_pools.py; 400/404 for none)."""
        svc = self.plane
        model_cls: type[OpenAIRequest] = ChatCompletionRequest if chat else CompletionRequest
        own = svc.renderer.tokenizer  # a token-id prompt is range-checked by it as it is validated (errors.py)
        body, req, checked = await decode_off_loop(raw, model_cls, svc.renderer.run,
                                                   own.token_ids_type if own is not None else None)
        refuse_router_only(req)  # on the decoded body, as the replica decodes it (router_only.py)
        check_grammar_limits(req, svc.renderer.config)  # before any replica is asked (grammar_limits.py)
        pool = svc.pool_for(req.model)
        tokenizer, renderer = svc.frontend_for(pool)
        if tokenizer is None:  # no tokenizer for its model: load-only routing, the replica validates
            return body, req, [], None, pool
        if isinstance(req, ChatCompletionRequest):
            prompts = [await renderer.request(req)]
        else:  # a batch of prompts is routed by its first; every prompt is checked, as the replica does
            prompts = await renderer.prompts(req, checked=checked.get("prompt") if tokenizer is own else None)
        params: list[SamplingParams] = [req.to_sampling_params(len(ids), tokenizer.max_model_len) for ids in prompts]
        return body, req, prompts, params[0] if params else None, pool

    async def read(self, http: HttpRequest, path: str, chat: bool) -> ProxyRequest:
        """The client's request: validated, tokenized, its tenant and priority (caller.py), a stream's migration
        state."""
        svc = self.plane
        refuse_router_only_headers(http)
        raw = await http.body()
        t0 = time.perf_counter_ns()
        body, req, prompts, params, pool = await self._validate(raw, chat)
        request = ProxyRequest(body, req, prompts, chat, svc.config.tokenize.forward_token_ids, path=path,
                               size=len(raw),
                               session_id=http.header(SESSION_HEADER) or req.user,
                               wants_receipt=http.header(HEADER_OPT_IN_BYTES) is not None,
                               tokenize_ns=time.perf_counter_ns() - t0, sampling_params=params, model_pool=pool)
        request.tenant, request.priority = identify(http, req, svc.tenants)
        if req.stream:
            tokenizer, renderer = svc.frontend_for(pool)
            request.stream = MigratingStream(req, chat, request.route_ids, tokenizer,
                                             svc.config.upstream.migration_limit, params=params,
                                             reads_reasoning=renderer.config.reasoning_parser is not None)
            request.stream.model_pool, request.stream.priority = pool, request.priority
            if svc.config.upstream.migration_limit and not req.return_token_ids:
                request.ask_for_token_ids()
        return request
