"""The door's routes of the proxied paths: ``POST /v1/completions`` and ``/v1/chat/completions`` (router/http/door.py),
each behind the app's auth rule and timed in the router's metrics, answered by the ``Forwarder`` (proxy.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvmesh.replica.openai.auth import authorization

if TYPE_CHECKING:
    from kvmesh.replica.openai.auth import AuthMiddleware
    from kvmesh.router.http.door import Handler
    from kvmesh.router.http.messages import HttpRequest, Response
    from kvmesh.router.http.proxy import Forwarder


def proxied_routes(forwarder: Forwarder, auth: AuthMiddleware, model_name: str) -> dict[tuple[bytes, str], Handler]:
    """The door's routes of the proxied paths (router/http/door.py), with the app's auth rule
    (``AuthMiddleware.refusal``): (method, path) -> handler."""
    metrics = forwarder.plane.metrics

    def route(path: str, chat: bool) -> Handler:
        async def handle(request: HttpRequest) -> Response:
            if auth.api is not None or auth.admin is not None or auth.tenant_key is not None:
                refused = auth.refusal("POST", path, authorization(request.raw_headers))
                if refused is not None:
                    raise refused
            start = time.perf_counter()
            response = await forwarder.handle(request, path, chat=chat)
            return metrics.observe_response(response, start, model_name)

        return handle

    return {(b"POST", "/v1/completions"): route("/v1/completions", False),
            (b"POST", "/v1/chat/completions"): route("/v1/chat/completions", True)}
