"""One client connection of the door: HTTP/1.1 parsed by httptools, requests answered in order.

What it guarantees, as the uvicorn stack did:

- keep-alive; ``Connection: close`` and HTTP/1.0 are honoured; chunked request bodies; ``Expect:
  100-continue`` is answered when the handler first reads the body (messages.py);
- a request head must arrive within ``header_timeout_s`` of the connection opening or of its first
  byte (slowloris), a body within ``body_timeout_s`` (408); idle keep-alive connections close after
  ``keep_alive_s``; more than ``max_body_bytes`` of body is a 413 (announced: before reading it);
- a head past ``max_header_bytes`` or ``max_headers`` is a 431, a request target past ``max_request_line_bytes``
  a 414, answered as soon as the limit is passed (head_limits.py: the parser never holds more);
- malformed HTTP gets a 400 (OpenAI-shaped) and the connection closes; a handler's bug is a 500;
- a client that disconnects cancels the handler of its current request (so the replica request is
  closed) and of a stream being sent.

Pipelined requests wait their turn, their bodies buffered. Every socket has TCP_NODELAY; each chunk of
a streamed body is written as it comes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Awaitable

import httptools
import msgspec
from kvmesh.replica.openai.head_limits import HeadLimits, linger
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.http.deadline import Deadline
from kvmesh.router.http.messages import Client, HttpRequest, Response, error_response, response_head
from kvmesh.router.http.response_body import write_stream
from kvmesh.router.http.server_state import DoorState

logger = logging.getLogger(__name__)

_MAX_PIPELINED = 32
"""Queued pipelined requests at which the connection stops reading until they are answered."""


class HttpConnection(asyncio.Protocol):
    """One client connection (see the module doc)."""

    def __init__(self, server: DoorState) -> None:
        self.server = server
        """What the door that accepted the connection shares: its answerer, limits and draining state."""
        self.config = server.config
        self.loop = asyncio.get_event_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.limits = HeadLimits(server.config)  # the head's bounds, counted before the parser sees its bytes
        self.transport: asyncio.Transport | None = None
        self.client = Client()
        """The client side its requests see: the transport, and whether the client left."""
        self.reading: HttpRequest | None = None
        """The request whose head/body the parser is in."""
        self.queue: collections.deque[HttpRequest] = collections.deque()
        """Requests waiting to be answered, the first being answered now."""
        self.task: asyncio.Task | None = None
        """Answers the queue, one request after the other (started by the first request)."""
        self._next: asyncio.Future | None = None
        """What the task waits on while the queue is empty."""
        self._url = b""
        self._head: list[tuple[bytes, bytes]] = []
        self._deadline = Deadline(self.loop, self._timed_out)
        """The head / keep-alive timeout (re-armed per request without a new timer)."""
        self._timeout: tuple[float, str] = (0.0, "")
        """The armed timeout's seconds and why it closes the connection (for the log)."""
        self._idle = False
        self._paused = False

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = self.client.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # not TCP (a unix socket)
                pass
        self.server.connections.add(self)
        self._arm(self.config.header_timeout_s, "sent no complete request head")

    def data_received(self, data: bytes) -> None:
        limits = self.limits
        try:
            if limits.fits(data):
                with limits:
                    self.parser.feed_data(data)
                return
            for piece in limits.pieces(data):
                with limits:
                    self.parser.feed_data(piece)
        except ProtocolError as e:  # a head past its limits (431, 414)
            self._refuse(e)
        except httptools.HttpParserUpgrade:
            self._refuse(ProtocolError("protocol upgrades are not supported", 400))
        except httptools.HttpParserError as e:
            self._refuse(ProtocolError(f"malformed HTTP request: {e}", 400))

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.leave()
        self._deadline.cancel()
        self.server.connections.discard(self)
        for request in self.queue:
            request._wake()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: the replica request (or stream) is closed

    def pause_writing(self) -> None:
        self.client.pause(True)

    def resume_writing(self) -> None:
        self.client.pause(False)

    # ---------------------------------------------------------------- httptools callbacks
    def on_message_begin(self) -> None:
        if not self._deadline.armed or self._idle:  # the head's deadline runs from its first byte
            self._arm(self.config.header_timeout_s, "sent no complete request head")
        self._url = b""
        self._head = []

    def on_url(self, url: bytes) -> None:
        self.limits.url(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.limits.header()
        self._head.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.limits.head_done()
        self._deadline.disarm()
        request = self.reading = HttpRequest(self.parser.get_method(), self._url, self.config, self.client)
        request.raw_headers = self._head
        request.keep_alive = self.parser.should_keep_alive()
        request.http_version = self.parser.get_http_version()
        limit = self.config.max_body_bytes
        for name, value in request.raw_headers:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                request.too_large = True  # refused before its body is read; the connection closes after
                request.size = int(value)
            elif name == b"expect" and value.lower() == b"100-continue":
                request.expect_continue = True
        self.queue.append(request)
        if self.task is None:
            self.task = self.loop.create_task(self._answer_queue())
        elif self._next is not None and not self._next.done():
            self._next.set_result(None)
        if len(self.queue) > _MAX_PIPELINED and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def on_body(self, body: bytes) -> None:
        request = self.reading
        if request.too_large:
            return  # dropped; the answer is a 413 and the connection closes
        request.size += len(body)
        request.chunks.append(body)
        if request.size > self.config.max_body_bytes:
            request.too_large = True
        request._wake()

    def on_message_complete(self) -> None:
        self.limits.message_done()
        request, self.reading = self.reading, None
        request.complete = True
        request._wake()

    # ---------------------------------------------------------------- answering
    async def _answer_queue(self) -> None:
        """The connection's one task: answer the queued requests in order, wait for the next (keep-alive)."""
        try:
            while True:
                while self.queue:
                    request = self.queue[0]
                    if request is _CLOSE or not await (self._too_large(request) if request.too_large
                                                       else self.server.answer(self, request)):
                        self.transport.close()
                        return
                    self.queue.popleft()
                    if self._paused and len(self.queue) <= _MAX_PIPELINED:
                        self._paused = False
                        self.transport.resume_reading()
                if self.server.draining:
                    self.transport.close()
                    return
                if self.reading is None:
                    self._arm(self.config.keep_alive_s, "was idle", idle=True)
                self._next = self.loop.create_future()
                await self._next
        except asyncio.CancelledError:
            return

    def _too_large(self, request: HttpRequest) -> Awaitable[bool]:
        """The 413 of a request announced too large, answered before its body is read (the connection closes)."""
        return self.send(request, error_response(ProtocolError(
            f"request body has {request.size} bytes; the limit is {self.config.max_body_bytes}", 413)),
            close=True, error=True)

    def keeps_alive(self, request: HttpRequest, close: bool) -> bool:
        """Whether the connection stays open after this answer (the unread rest of a body ends it)."""
        return not (close or self.server.draining or not request.keep_alive or not request.complete)

    def head(self, request: HttpRequest, status: int, headers, length: int | None, keep: bool,
             chunked: bool = False) -> bytes:
        """The status line and headers (``response_head``, messages.py), with the server's extra ones."""
        return response_head(request, status, headers, length, keep, chunked, self.server.extra_head)

    async def send(self, request: HttpRequest, response: Response, close: bool = False, error: bool = False) -> bool:
        """Write ``response``; whether the connection stays open."""
        if error and self.server.on_error is not None:
            self.server.on_error(ProtocolError("", response.status))
        keep = self.keeps_alive(request, close)
        headers = [(b"content-type", response.media_type.encode("latin-1"))]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
        if response.stream is None:
            head = self.head(request, response.status, headers, len(response.body), keep)
            self.write(head + response.body if request.method != b"HEAD" else head)
            return keep
        chunked = request.http_version != "1.0"
        keep = keep and chunked  # an HTTP/1.0 stream ends when the connection closes
        self.write(self.head(request, response.status, headers, None, keep, chunked))
        await write_stream(self.client, response.stream, chunked)
        return keep

    @property
    def lost(self) -> bool:
        """The client left."""
        return self.client.lost

    def write(self, data: bytes) -> None:
        self.client.write(data)

    # ---------------------------------------------------------------- timers and closing
    def _arm(self, seconds: float, why: str, idle: bool = False) -> None:
        self._idle = idle
        self._timeout = (seconds, why)
        self._deadline.arm(seconds)

    def _timed_out(self) -> None:
        seconds, why = self._timeout
        if not self.queue and not self.transport.is_closing():
            logger.debug("closing a connection that %s for %.0fs", why, seconds)
            self.transport.close()

    def _refuse(self, e: ProtocolError) -> None:
        """Malformed input or a head past its limits: its answer unless one is under way, then close. Nothing
        more is parsed, and the parser's buffered head is dropped now."""
        self.transport.pause_reading()
        self.limits.refused = True
        self.parser, self._url, self._head = httptools.HttpRequestParser(self), b"", []
        if not self.queue:
            if self.server.on_error is not None:
                self.server.on_error(e)
            body = msgspec.json.encode(e.to_dict())
            request = HttpRequest(b"GET", b"/", self.config, self.client)
            self.write(self.head(request, e.status_code, [(b"content-type", b"application/json")], len(body),
                                 keep=False) + body)
            linger(self.transport)
        else:  # answer the requests that parsed; the task closes the connection when they are done
            if self.reading is not None and self.reading in self.queue:  # its body was malformed
                self.reading.error = e
                self.reading._wake()
            self.queue.append(_CLOSE)
            self.reading = None

    def close_if_idle(self) -> None:
        if not self.queue:
            self.transport.close()

    def abort(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.transport.close()


_CLOSE = HttpRequest(b"", b"")
"""Queued after the last request a connection could parse: closes it once those are answered."""
