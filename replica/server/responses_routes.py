"""A replica's ``/v1/responses`` (replica/openai/responses_api/): its own chat path answers, its own memory stores.

    POST   /v1/responses          a Response, whole or as ``response.*`` events
    GET    /v1/responses/{id}     a stored Response
    GET    /v1/responses/{id}/input_items   its input items (OpenAI's list: limit, order, after)
    DELETE /v1/responses/{id}     gone

A replica's tenant is its caller's key: the ``Authorization`` header's digest (one API key, one tenant; a server
with no key stores every caller's responses together, as it serves them). Behind a router the router stores them.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from kvmesh.replica.openai.auth import authorization
from kvmesh.replica.openai.body import parse_off_loop, read_request
from kvmesh.replica.openai.protocol import ChatCompletionRequest
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from kvmesh.replica.openai.responses_api.service import Answer, ResponsesService
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore
from kvmesh.replica.serving.json_types import JSONObject

if TYPE_CHECKING:
    from kvmesh.replica.server.completions import OpenAIHandlers
    from kvmesh.replica.server.state import ServerState


def caller_tenant(http: Request) -> str:
    """The tenant whose stored responses a request reaches: a digest of its key (module doc)."""
    return hashlib.sha256(authorization(http.scope["headers"])).hexdigest()


async def _text(chunks: AsyncIterator[str | bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk.encode() if isinstance(chunk, str) else chunk


def install_responses_routes(app: FastAPI, state: ServerState, handlers: OpenAIHandlers) -> None:
    """Add the routes of the module doc to a replica's app."""
    service = ResponsesService(SQLiteResponseStore(state.frontend), lambda: state.model_name)

    @app.post("/v1/responses")
    async def create(http: Request):
        req = await read_request(http, ResponsesRequest, state.frontend, state.renderer.run)
        state.check_model(req.model)

        async def chat(body: JSONObject) -> Answer:
            chat_req = await parse_off_loop(msgspec.json.encode(body), ChatCompletionRequest, state.renderer.run)
            answer = await handlers.serve_chat(http, chat_req)
            if isinstance(answer, StreamingResponse):
                return Answer(answer.status_code, stream=_text(answer.body_iterator))
            return Answer(answer.status_code, bytes(answer.body))

        answer = await service.create(req, caller_tenant(http), chat)
        if answer.stream is not None:
            return StreamingResponse(answer.stream, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return Response(answer.body, answer.status, answer.headers, media_type="application/json")

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, http: Request):
        return JSONResponse(await service.retrieve(caller_tenant(http), response_id))

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, http: Request):
        return JSONResponse(await service.input_items(caller_tenant(http), response_id, dict(http.query_params)))

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, http: Request):
        return JSONResponse(await service.delete(caller_tenant(http), response_id))
