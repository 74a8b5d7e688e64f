"""Endpoints the router and the replica serve the same way, from one implementation.

    POST /tokenize                      token ids exactly as a request would get them
    POST /detokenize                    {"tokens": [...]} -> {"prompt": text} (vLLM's)
    POST /v1/completions/render         [GenerateRequest] per prompt (vLLM's render API; vllm-router calls it)
    POST /v1/chat/completions/render    one GenerateRequest
    GET  /version                       {"version": "<kvmesh version>"}

Both servers answer with the same status and error body for the same request (tests/test_openai_parity.py).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import TypeVar

from fastapi import FastAPI, Request
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.openai.refused_fields import RENDER_ONLY, refuse_unimplemented
from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.replica.openai.responses import DetokenizeResponse, RenderedRequest, TokenizeResponse, random_id
from kvmesh.replica.openai.sampling_fields import SamplingFields
from kvmesh.replica.openai.tokenize_requests import DetokenizeRequest, TokenizeRequest
from pydantic import JsonValue

Routed = TypeVar("Routed", TokenizeRequest, DetokenizeRequest, CompletionRequest, ChatCompletionRequest)
BodyCheck = Callable[[Request, SamplingFields], None]
"""Refuses (raises ProtocolError) a decoded completion or chat body the server will not take from this caller:
the router's router-only fields (router/http/router_only.py), a replica's KV plane (replica/server/kv_plane.py)."""


def accept_any(http: Request, req: SamplingFields) -> None:
    return None


def kvmesh_version() -> str:
    try:
        return metadata.version("kvmesh")
    except metadata.PackageNotFoundError:
        return "unknown"


def install_shared_routes(app: FastAPI, renderer: PromptRenderer, check_model: Callable[[str | None], None],
                          model_name: Callable[[], str], check_body: BodyCheck = accept_any) -> None:
    """Add the shared endpoints to ``app``; ``check_model`` raises the 404 for a model not served, ``check_body``
    refuses a render body the server will not take (the same rule as its completion paths)."""
    config = renderer.config

    def max_model_len() -> int:
        return renderer.require_tokenizer().max_model_len

    async def read(http: Request, model_cls: type[Routed]) -> Routed:
        req = await read_request(http, model_cls, config, renderer.run)
        check_model(req.model)
        return req

    def rendered(req: CompletionRequest | ChatCompletionRequest, ids: list[int], prefix: str) -> dict[str, JsonValue]:
        refuse_unimplemented(req, RENDER_ONLY)
        params = req.to_sampling_params(len(ids), max_model_len())
        return RenderedRequest(
            request_id=req.request_id or random_id(prefix), token_ids=ids, model=req.model or model_name(),
            sampling_params=params.as_dict(), stream=req.stream, cache_salt=req.cache_salt,
            stream_options=req.stream_options.model_dump() if req.stream_options else None).model_dump()

    @app.post("/tokenize")
    async def tokenize(http: Request):
        req = await read(http, TokenizeRequest)
        ids = await renderer.tokenize(req)
        return TokenizeResponse(count=len(ids), max_model_len=max_model_len(), tokens=ids).model_dump()

    @app.post("/detokenize")
    async def detokenize(http: Request):
        req = await read(http, DetokenizeRequest)
        return DetokenizeResponse(prompt=await renderer.detokenize(req)).model_dump()

    @app.post("/v1/completions/render")
    async def render_completion(http: Request):
        req = await read(http, CompletionRequest)
        check_body(http, req)
        return [rendered(req, ids, "cmpl") for ids in await renderer.prompts(req)]

    @app.post("/v1/chat/completions/render")
    async def render_chat(http: Request):
        req = await read(http, ChatCompletionRequest)
        check_body(http, req)
        return rendered(req, await renderer.request(req), "chatcmpl")

    @app.get("/version")
    async def version():
        return {"version": kvmesh_version()}
