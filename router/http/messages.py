"""What the router's HTTP server hands its handlers and takes back: ``HttpRequest`` and ``Response``.

An ``HttpRequest`` has its head parsed; its body arrives through ``await request.body()``, which applies the
front end's limits as it reads (413 over ``max_body_bytes``, 408 slower than ``body_timeout_s``, 499
when the client leaves) and answers ``Expect: 100-continue`` first. A ``Response`` is a whole body or
an async iterator of chunks (sent with chunked encoding as each arrives); ``response_head`` is the
status line and headers that go before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from http import HTTPStatus

import msgspec
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.serving.errors import ProtocolError

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class Client:
    """The client side of a connection as its requests see it: where to write ahead of the answer (``100
    Continue``), whether the client left and whether it keeps up with what is written (set by the connection,
    http/connection.py)."""

    __slots__ = ("transport", "lost", "paused", "_drained")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        """The client left."""
        self.paused = False
        """The transport's buffer is full (its ``pause_writing``): a stream waits for ``drain`` before its next
        chunk."""
        self._drained: asyncio.Future | None = None

    def write(self, data: bytes) -> None:
        if not self.lost:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the client took what was written (a slow reader holds the stream back)."""
        if self.paused and not self.lost:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def pause(self, paused: bool) -> None:
        """The transport paused writing (True) or resumed it (False: a waiting ``drain`` returns)."""
        self.paused = paused
        if not paused:
            self._wake()

    def leave(self) -> None:
        """The client left (a waiting ``drain`` returns)."""
        self.lost = True
        self._wake()

    def _wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)


class HttpRequest:
    """One request on a connection (see the module doc)."""

    __slots__ = ("method", "target", "raw_headers", "keep_alive", "http_version", "chunks", "size",
                 "complete", "too_large", "expect_continue", "config", "client", "waiter", "_headers", "_by_name",
                 "started", "error")

    def __init__(self, method: bytes, target: bytes, config: FrontendConfig | None = None,
                 client: Client | None = None) -> None:
        self.config = config
        """The front end's limits (``max_body_bytes``, ``body_timeout_s``)."""
        self.client = client
        """Its connection's client side: the ``100 Continue`` is written there, and it says whether the client left."""
        self.method = method
        self.target = target
        """The request target as sent: path and query."""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        """(lowercase name, value), as ASGI wants them."""
        self._headers: dict[str, str] | None = None
        self._by_name: dict[bytes, bytes] | None = None
        self.keep_alive = True
        self.http_version = "1.1"
        self.chunks: list[bytes] = []
        self.size = 0
        self.complete = False
        """The whole body arrived."""
        self.too_large = False
        """More than ``max_body_bytes`` arrived (the rest was dropped)."""
        self.expect_continue = False
        self.waiter: asyncio.Future | None = None
        self.started = False
        """The response head went out (a failure then can only close the connection)."""
        self.error: ProtocolError | None = None
        """The rest of the request was malformed HTTP (reading its body raises this)."""

    @property
    def path(self) -> str:
        return self.target.partition(b"?")[0].decode("latin-1")

    @property
    def headers(self) -> dict[str, str]:
        """Lowercase names -> values (the last of repeated headers)."""
        if self._headers is None:
            self._headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.raw_headers}
        return self._headers

    def header(self, name: bytes) -> str | None:
        """One header's value (the last if repeated; ``name`` lowercase), None when absent: the hot path's
        look-up, from the raw headers by name (made at the first call), without decoding them all."""
        by_name = self._by_name
        if by_name is None:
            by_name = self._by_name = dict(self.raw_headers)
        found = by_name.get(name)
        return None if found is None else found.decode("latin-1")

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next_chunk(self, deadline: float | None = None) -> bytes | None:
        """The body bytes that arrived since the last call, None at its end; sends ``100 Continue`` first
        when asked. ProtocolError 408 after ``deadline`` (loop time), 499 when the client left."""
        if self.expect_continue:
            self.expect_continue = False
            if not self.complete and not self.chunks:
                self.client.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        loop = asyncio.get_running_loop()
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.complete:
                return None
            if self.client.lost:
                raise ProtocolError("client disconnected while sending the body", 499)
            self.waiter = loop.create_future()
            timer = None if deadline is None else loop.call_at(deadline, self._wake)
            try:
                await self.waiter
            finally:
                self.waiter = None
                if timer is not None:
                    timer.cancel()
            if deadline is not None and not self.chunks and not self.complete and loop.time() >= deadline:
                raise ProtocolError(f"request body did not arrive within {self.config.body_timeout_s}s", 408)
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        return data

    async def body(self) -> bytes:
        """The whole body, within the front end's limits (see the module doc)."""
        config = self.config
        if self.too_large:
            raise ProtocolError(f"request body has more than {config.max_body_bytes} bytes; the limit is "
                                f"{config.max_body_bytes}", 413)
        if self.complete and not self.expect_continue:  # the usual case: it came with the head
            data = b"".join(self.chunks)
            self.chunks.clear()
            return data
        deadline = asyncio.get_running_loop().time() + config.body_timeout_s
        parts = []
        while (chunk := await self.next_chunk(deadline)) is not None:
            parts.append(chunk)
            if self.too_large:
                raise ProtocolError(f"request body has more than {config.max_body_bytes} bytes; the limit is "
                                    f"{config.max_body_bytes}", 413)
        return b"".join(parts)


class Response:
    """A status, headers and either ``body`` (bytes) or ``stream`` (an async iterator of bytes)."""

    __slots__ = ("status", "headers", "body", "stream", "media_type")

    def __init__(self, body: bytes = b"", status: int = 200, media_type: str = "application/json",
                 headers: dict[str, str] | None = None, stream: AsyncIterator[bytes] | None = None) -> None:
        self.status = status
        self.body = body
        self.stream = stream
        self.media_type = media_type
        self.headers: dict[str, str] = headers if headers is not None else {}
        """Extra headers (content type and length are added when sent)."""


def error_response(e: ProtocolError) -> Response:
    """The OpenAI-shaped error answer of ``e``."""
    return Response(msgspec.json.encode(e.to_dict()), e.status_code)


def response_head(request: HttpRequest, status: int, headers: list[tuple[bytes, bytes]], length: int | None,
                  keep: bool, chunked: bool = False, extra_head: bytes = b"") -> bytes:
    """The status line and headers of the answer to ``request`` (which is marked started), with
    ``content-length: length`` unless None, or chunked encoding; ``extra_head``: more header lines."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    lines += [k + b": " + v + b"\r\n" for k, v in headers]
    if length is not None:
        lines.append(b"content-length: %d\r\n" % length)
    elif chunked:
        lines.append(b"transfer-encoding: chunked\r\n")
    if not keep:
        lines.append(b"connection: close\r\n")
    elif request.http_version == "1.0":
        lines.append(b"connection: keep-alive\r\n")
    lines.append(extra_head)
    lines.append(b"\r\n")
    request.started = True
    return b"".join(lines)
