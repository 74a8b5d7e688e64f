"""The router's ``/v1/responses`` (replica/openai/responses_api/): each Response's chat goes through the proxy.

    POST   /v1/responses          rendered to a chat request and answered by ``Forwarder.handle`` as any chat: read,
                                  admitted, routed by its rendered prefix (a continuation's prefix is its stored
                                  conversation, so it goes to the replica holding it), relayed
    GET    /v1/responses/{id}     the caller's tenant's stored Response, else 404
    GET    /v1/responses/{id}/input_items   its input items (a page: ``limit``, ``order``, ``after``), else 404
    DELETE /v1/responses/{id}     the same, then gone

The chat request carries the client's headers (its key, its session, the route receipt's opt-in: the receipt's
headers come back on the Response). Stored responses belong to the tenant of the caller's key, as admission names it
(``Tenants.resolve``); the store is the service's (``ResponsesService.store``: shared by a router's workers,
router/control/workers.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import msgspec
from kvmesh.replica.openai.auth import authorization
from kvmesh.replica.openai.body import parse_off_loop
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from kvmesh.replica.openai.responses_api.service import INPUT_ITEMS, PREFIX, Answer
from kvmesh.router.http.caller import bearer_key
from kvmesh.router.http.messages import HttpRequest, Response

if TYPE_CHECKING:
    from kvmesh.replica.openai.auth import AuthMiddleware
    from kvmesh.replica.openai.responses_api.service import ResponsesService
    from kvmesh.replica.serving.json_types import JSONObject
    from kvmesh.router.admission.tenants import Tenants
    from kvmesh.router.http.door import Door
    from kvmesh.router.http.proxy import Forwarder

CHAT_PATH = "/v1/chat/completions"


def chat_request(http: HttpRequest, body: bytes) -> HttpRequest:
    """The client's request with ``body`` for the chat path: its headers and connection kept."""
    request = HttpRequest(http.method, CHAT_PATH.encode(), http.config, http.client)
    request.raw_headers = http.raw_headers
    request.chunks, request.size, request.complete = [body], len(body), True
    return request


def is_stored_response(method: str, path: str) -> bool:
    """``GET`` / ``DELETE /v1/responses/{id}`` (the door's rule)."""
    return method in ("GET", "DELETE") and path.startswith(PREFIX) and len(path) > len(PREFIX)


class ResponsesRoutes:
    """The door's handlers of the module doc."""

    def __init__(self, forwarder: Forwarder, auth: AuthMiddleware, service: ResponsesService, tenants: Tenants,
                 model_name: str) -> None:
        self.forwarder, self.auth, self.service, self.tenants = forwarder, auth, service, tenants
        self.model_name = model_name

    def install(self, door: Door) -> None:
        door.routes[(b"POST", "/v1/responses")] = self.create
        door.add_rule(is_stored_response, self.stored)

    def _check(self, request: HttpRequest) -> str:
        """The auth rule (a ProtocolError refusing it); the caller's tenant."""
        method, path = request.method.decode("latin-1"), request.path
        if self.auth.api is not None or self.auth.admin is not None or self.auth.tenant_key is not None:
            refused = self.auth.refusal(method, path, authorization(request.raw_headers))
            if refused is not None:
                raise refused
        return self.tenants.resolve(bearer_key(request), None).name

    async def create(self, http: HttpRequest) -> Response:
        tenant = self._check(http)
        start, metrics = time.perf_counter(), self.forwarder.plane.metrics
        req = await parse_off_loop(await http.body(), ResponsesRequest, self.forwarder.plane.renderer.run)

        async def chat(body: JSONObject) -> Answer:
            answer = await self.forwarder.handle(chat_request(http, msgspec.json.encode(body)), CHAT_PATH, chat=True)
            return Answer(answer.status, answer.body, answer.stream, answer.headers)

        answer = await self.service.create(req, tenant, chat)
        media = answer.headers.pop("content-type", "application/json")
        response = Response(answer.body, answer.status, media, answer.headers, answer.stream)
        return metrics.observe_response(response, start, self.model_name)

    async def stored(self, http: HttpRequest) -> Response:
        tenant = self._check(http)
        response_id = http.path[len(PREFIX):]
        if http.method == b"GET" and response_id.endswith(INPUT_ITEMS):
            query = dict(parse_qsl(http.target.partition(b"?")[2].decode("latin-1")))
            page = await self.service.input_items(tenant, response_id.removesuffix(INPUT_ITEMS), query)
            return Response(msgspec.json.encode(page))
        if http.method == b"GET":
            return Response(msgspec.json.encode(await self.service.retrieve(tenant, response_id)))
        return Response(msgspec.json.encode(await self.service.delete(tenant, response_id)))
