"""Serving the router's FastAPI app (every path the door does not answer itself, door.py) over a connection.

``AsgiBridge.answer`` runs one request through the ASGI app: ``receive`` hands it the body as it
arrives, then ``http.disconnect`` once the client leaves; ``send`` writes the head (with the app's
content-length, else chunked) and each body part as it comes. ``lifespan`` runs the app's lifespan
(the router's runtime start/stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.http.messages import HttpRequest, error_response

if TYPE_CHECKING:
    from kvmesh.router.http.connection import HttpConnection

logger = logging.getLogger(__name__)

AsgiMessage = MutableMapping[str, Any]
"""An ASGI scope or event: a JSON-like dict whose keys the ASGI spec names."""
Receive = Callable[[], Awaitable[AsgiMessage]]
Send = Callable[[AsgiMessage], Awaitable[None]]
AsgiApp = Callable[[AsgiMessage, Receive, Send], Awaitable[None]]
"""An ASGI 3 application (the router's FastAPI app)."""


@dataclass
class _Exchange:
    """One request's run through the app: its ``receive`` and ``send``, and what the app sent so far."""

    conn: HttpConnection
    request: HttpRequest
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunked: bool = False
    """The body goes with chunked encoding (no content-length, more than one part)."""
    keep: bool = True
    """The connection stays open after it."""
    body_read: bool = False
    """The app has received the whole request body."""
    done: bool = False
    """The last body part went out."""

    async def receive(self) -> dict:
        """The body as it arrives, then ``http.disconnect`` once the client leaves."""
        conn, request = self.conn, self.request
        if not self.body_read:
            try:
                chunk = await request.next_chunk()  # body.py applies the deadline and the size limit
            except ProtocolError:  # the client left
                return {"type": "http.disconnect"}
            more = chunk is not None and not (request.complete and not request.chunks)
            self.body_read = not more
            return {"type": "http.request", "body": chunk or b"", "more_body": more}
        while not conn.lost:  # the body was read: only the client leaving comes now
            request.waiter = asyncio.get_running_loop().create_future()
            await request.waiter
        return {"type": "http.disconnect"}

    async def send(self, message: AsgiMessage) -> None:
        """Keep the response's start; write each body part as it comes, the head before the first."""
        conn, request = self.conn, self.request
        kind = message["type"]
        if kind == "http.response.start":
            self.status, self.headers = message["status"], list(message.get("headers", ()))
            return
        if kind != "http.response.body" or self.done:
            return
        body, more = message.get("body", b""), message.get("more_body", False)
        if not request.started:
            self._write_head(body, more)
        if body and request.method != b"HEAD":
            conn.write(b"%x\r\n%b\r\n" % (len(body), body) if self.chunked else body)
            await conn.client.drain()
        if not more:
            if self.chunked:
                conn.write(b"0\r\n\r\n")
            self.done = True

    def _write_head(self, body: bytes, more: bool) -> None:
        """The status line and headers: the app's content-length, else the first part's length when it is the
        only one, else chunked (HTTP/1.0: the connection's close ends the body)."""
        conn, request, headers = self.conn, self.request, self.headers
        declared = any(k.lower() == b"content-length" for k, _ in headers)
        length = None if declared else (len(body) if not more else None)
        self.chunked = not declared and more and request.http_version != "1.0"
        if request.http_version == "1.0" and not declared and more:
            self.keep = False
        keep = self.keep = self.keep and conn.keeps_alive(
            request, any(k.lower() == b"connection" and v.lower() == b"close" for k, v in headers))
        headers = [(k, v) for k, v in headers if k.lower() != b"connection"]
        conn.write(conn.head(request, self.status, headers, length, keep, self.chunked))


def _scope(conn: HttpConnection, request: HttpRequest) -> AsgiMessage:
    """The request's ASGI http scope."""
    path, _, query = request.target.partition(b"?")
    sock = conn.transport.get_extra_info("sockname")
    peer = conn.transport.get_extra_info("peername")
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.http_version, "method": request.method.decode("latin-1"), "scheme": "http",
        "path": unquote(path.decode("latin-1")), "raw_path": path, "query_string": query, "root_path": "",
        "headers": request.raw_headers,
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": tuple(sock[:2]) if isinstance(sock, tuple) else None,
    }


class AsgiBridge:
    """Runs requests, and the app's lifespan, through an ASGI app (see the module doc)."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """The ASGI lifespan protocol around serving (the app may be wrapped, e.g. by a worker's setup):
        startup before the block, shutdown after it; a failed startup raises."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        started, stopped = loop.create_future(), loop.create_future()

        async def send(message: AsgiMessage) -> None:
            kind = message["type"]
            done = started if kind.startswith("lifespan.startup") else stopped
            if done.done():
                return
            if kind.endswith(".failed"):
                done.set_exception(RuntimeError(f"{kind}: {message.get('message', '')}"))
            else:
                done.set_result(None)

        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        task = asyncio.ensure_future(self.app(scope, inbox.get, send))
        await inbox.put({"type": "lifespan.startup"})
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()  # re-raises why the app's lifespan ended
            raise RuntimeError("the app's lifespan ended before its startup completed")
        started.result()
        try:
            yield
        finally:
            await inbox.put({"type": "lifespan.shutdown"})
            await asyncio.wait({stopped, task}, return_when=asyncio.FIRST_COMPLETED)
            if stopped.done() and stopped.exception() is not None:
                logger.error("the router app's shutdown failed: %s", stopped.exception())
            await asyncio.gather(task, return_exceptions=True)

    async def answer(self, conn: HttpConnection, request: HttpRequest) -> bool:
        """Run ``request`` through the app; whether the connection stays open."""
        scope, state = _scope(conn, request), _Exchange(conn, request)
        try:
            await self.app(scope, state.receive, state.send)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the app's error handlers answer everything; this is a last resort
            logger.exception("unhandled error in the router app")
            if request.started:
                return False
            return await conn.send(request, error_response(ProtocolError("internal router error", 500)),
                                    close=True, error=True)
        if not request.started:  # the app answered nothing
            return await conn.send(request, error_response(ProtocolError("the router app sent no answer", 500)),
                                    error=True)
        return state.keep and state.done
