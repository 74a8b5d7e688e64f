"""The router's one door: every request enters here, and one table says who answers it.

    Door(routes, app, frontend).listen(sock)

One listening socket, asyncio (uvloop when installed) + httptools (connection.py parses each client
connection). A parsed request is answered by the first of:

    routes   (method, path) -> handler       the proxied paths (router/http/proxied_routes.py)
    rules    (method, path) -> bool, handler e.g. a serve worker's admin plane, passed to the control
                                             router (router/control/follow.py)
    app      the ASGI app (asgi.py)          every other path: /health, /v1/models, /tokenize, /replicas...

Handlers take an ``HttpRequest`` and return a ``Response`` (messages.py) without ASGI; a ``ProtocolError``
they raise is answered OpenAI-shaped. ``shutdown``: stop accepting, ``Connection: close`` on every later
answer, idle connections closed, in-flight requests finish within ``graceful_s``, then everything closes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.serving.errors import ProtocolError, internal_error
from kvmesh.router.http.asgi import AsgiApp, AsgiBridge
from kvmesh.router.http.connection import HttpConnection
from kvmesh.router.http.messages import HttpRequest, Response, error_response
from kvmesh.router.http.server_state import DoorState

logger = logging.getLogger(__name__)

Handler = Callable[[HttpRequest], Awaitable[Response]]
"""Answers one request (no ASGI)."""
Rule = Callable[[str, str], bool]
"""Whether a request (method, path) is for a rule's handler."""


class Door:
    """Serves ``routes``, ``rules`` and the ASGI ``app`` on one listening socket (see the module doc)."""

    def __init__(self, routes: dict[tuple[bytes, str], Handler], app: AsgiApp, frontend: FrontendConfig,
                 extra_headers: list[tuple[bytes, bytes]] | None = None, name: str = "kvmesh-router") -> None:
        self.routes = routes
        """(method, path) -> its handler, looked up first."""
        self.rules: list[tuple[Rule, Handler]] = []
        """Handlers for every request a rule takes, tried in order after ``routes``."""
        self.asgi = AsgiBridge(app)
        """The app answering everything else."""
        self.config = frontend
        self.name = name
        self.state = DoorState(frontend, self.answer,
                                 b"".join(k + b": " + v + b"\r\n" for k, v in (extra_headers or [])))
        """What every accepted connection shares: the open connections, the draining flag, the error counter."""
        self._server: asyncio.AbstractServer | None = None

    @property
    def on_error(self) -> Callable[[ProtocolError], None] | None:
        """Sees errors answered by the server itself (400, 413, 500) (the router counts them)."""
        return self.state.on_error

    @on_error.setter
    def on_error(self, on_error: Callable[[ProtocolError], None] | None) -> None:
        self.state.on_error = on_error

    def add_rule(self, rule: Rule, handler: Handler) -> None:
        """Answer every request ``rule`` takes with ``handler`` (before the app)."""
        self.rules.append((rule, handler))

    def handler_for(self, request: HttpRequest) -> Handler | None:
        """The handler of ``request``; None: the app answers it."""
        handler = self.routes.get((request.method, request.path))
        if handler is None and self.rules:
            method, path = request.method.decode("latin-1"), request.path
            handler = next((h for rule, h in self.rules if rule(method, path)), None)
        return handler

    async def answer(self, conn: HttpConnection, request: HttpRequest) -> bool:
        """Answer one request on ``conn``; whether the connection stays open."""
        handler = self.handler_for(request)
        if handler is None:
            return await self.asgi.answer(conn, request)
        try:
            response = await handler(request)
        except ProtocolError as e:
            if e.status_code == 499 or conn.lost:
                return False
            return await conn.send(request, error_response(e), close=e.status_code in (408, 413), error=True)
        except Exception as e:  # noqa: BLE001 - a bug answers this request, the server keeps serving
            error = internal_error("router", e, logger, what=f"unhandled error in {request.path}")
            return await conn.send(request, error_response(error), error=True)
        return await conn.send(request, response)

    # ---------------------------------------------------------------- listening
    async def listen(self, host: str | None = None, port: int = 0, sock: socket.socket | None = None) -> int:
        """Start accepting (on ``sock`` when given, e.g. inherited by a worker); the bound port."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await loop.create_server(lambda: HttpConnection(self.state), sock=sock, backlog=2048)
        else:
            self._server = await loop.create_server(lambda: HttpConnection(self.state), host, port, backlog=2048,
                                                    reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    def stop_accepting(self) -> None:
        """Close the listening socket; every later answer closes its connection."""
        self.state.draining = True
        if self._server is not None:
            self._server.close()

    async def shutdown(self, graceful_s: float, drain_s: float = 0.0) -> None:
        """Stop accepting; for ``drain_s`` keep answering what arrives on open connections (with ``Connection:
        close``); then close idle connections, let in-flight requests finish within ``graceful_s``, close all."""
        self.stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        while self.state.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.state.connections):
            conn.close_if_idle()
        deadline = loop.time() + graceful_s
        while self.state.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.state.connections):
            conn.abort()
        await asyncio.sleep(0)
