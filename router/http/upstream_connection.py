"""One keep-alive connection to a replica and the answer it carries (the pool is upstream.py).

``UpstreamConnection`` parses the replica's HTTP/1.1 answer with httptools into its ``UpstreamResponse``: status
and headers once they arrived, then the body as an async iterator. A response read to its end goes back
to the pool (``release``); an abandoned one closes its connection (``close``), so the replica aborts.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httptools
from kvmesh.router.http.deadline import Deadline

if TYPE_CHECKING:
    from kvmesh.router.replicas.patience import Patience


class UpstreamError(Exception):
    """The replica connection failed (reset, closed early, timed out, bad HTTP)."""


class UpstreamConnectError(UpstreamError):
    """No connection could be made to the replica (refused, unreachable, connect timeout)."""


class DeadlineMissed(UpstreamError):
    """The replica sent no first bytes, or a started answer stalled, within its ``Patience`` (patience.py)."""

    def __init__(self, message: str, first_byte: bool, progressed: bool) -> None:
        super().__init__(message)
        self.first_byte = first_byte
        """No body byte had arrived yet (else: a started answer stalled)."""
        self.progressed = progressed
        """The replica showed progress meanwhile: the miss does not count against it."""


class StaleConnection(UpstreamError):
    """A reused connection ended before any answer byte: the request is sent again on a fresh one."""


_LINGER_S = 1.0
"""How long a released answer may take to end before its connection is closed rather than pooled."""
_HIGH_WATER = 64
"""Unread body chunks at which reading from the replica pauses (the client reads slower than it writes)."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, key: tuple, keep: Callable[[UpstreamConnection], None],
                 forget: Callable[[UpstreamConnection], None]) -> None:
        self.key = key
        """(host, port, https, replica id): the pool's key for it."""
        self.keep = keep
        """Keeps the connection for the next request to its replica (its answer was read to the end)."""
        self.forget = forget
        """Drops it from the kept ones (it closed)."""
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.reused = False
        self.idle_since = 0.0
        self.closed = False
        self.read_deadline = Deadline(asyncio.get_running_loop(), self._read_timed_out)
        """The current wait's ``read_timeout_s`` (re-armed per wait without a new timer)."""

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        r = self.response
        if r is None:  # bytes nobody asked for: this connection cannot be trusted any more
            self.transport.close()
            return
        r.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            r._fail(UpstreamError(f"the replica sent malformed HTTP: {e}"))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.read_deadline.cancel()
        self.forget(self)
        r = self.response
        if r is not None and r.lingering is not None:
            r.lingering.cancel()
            r.lingering = None
        if r is not None and not r.complete:
            if r.status and "content-length" not in r.headers and "transfer-encoding" not in r.headers:
                r.complete = True  # a body delimited by the connection's end (HTTP/1.0 style)
                r._wake()
            elif self.reused and not r.received:
                r._fail(StaleConnection("the pooled connection was closed by the replica"))
            else:
                how = "reset" if isinstance(exc, ConnectionResetError) else "closed"
                r._fail(UpstreamError(f"the replica {how} the connection before the answer ended"))

    def _read_timed_out(self) -> None:
        if self.response is not None:
            self.response._timed_out()

    def pause_writing(self) -> None:  # the request bodies are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # ---------------------------------------------------------------- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        r = self.response
        r.status = self.parser.get_status_code()
        r._wake()

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r.lingering is not None:
            return
        r.chunks.append(body)
        if len(r.chunks) >= _HIGH_WATER and not r.paused:
            r.paused = True
            self.transport.pause_reading()
        r._wake()

    def on_message_complete(self) -> None:
        r = self.response
        r.complete = True
        r.keep_alive = self.parser.should_keep_alive()
        if r.lingering is not None:  # released before its end: now it can go back to the pool
            r.lingering.cancel()
            r.lingering = None
            r.chunks.clear()
            r._done = False
            r.release()
        r._wake()


class UpstreamResponse:
    """A replica's answer: status and headers once they arrived, then the body as an async iterator."""

    __slots__ = ("conn", "status", "headers", "chunks", "complete", "keep_alive", "received", "paused", "error",
                 "_timeout", "patience", "started", "_armed", "_period_start", "_first_wait", "_waiter", "_done",
                 "lingering")

    def __init__(self, conn: UpstreamConnection, read_timeout_s: float | None,
                 patience: Patience | None = None) -> None:
        self.conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        """Lowercase names."""
        self.chunks: collections.deque[bytes] = collections.deque()
        self.complete = False
        self.keep_alive = False
        self.received = False
        self.paused = False
        self.error: BaseException | None = None
        self._timeout = read_timeout_s
        self.patience = patience
        """The deadlines of this answer (first bytes, then idle gaps); None: only ``read_timeout_s``."""
        self.started = False
        """A body chunk was handed out: idle gaps count from now on, not the first-byte wait."""
        self._armed: float | None = None
        """Seconds of the patience deadline now armed (None: the read timeout is)."""
        self._period_start = self._first_wait = 0.0
        self._waiter: asyncio.Future | None = None
        self._done = False
        self.lingering: asyncio.TimerHandle | None = None
        """Released before the end of the message arrived: closes the connection unless it arrives soon."""

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    async def _wait(self) -> None:
        """Until the connection has news (bytes, the end, a failure), at most ``read_timeout_s`` or the
        patience deadline now due (patience.py)."""
        self._waiter = asyncio.get_running_loop().create_future()
        seconds, self._armed = self._timeout, None
        p = self.patience
        if p is not None:
            limit = p.idle_s if self.started else p.first_byte_s
            if limit is not None and (seconds is None or limit < seconds):
                seconds = self._armed = limit
                self._period_start = now = time.monotonic()
                if not self._first_wait:
                    self._first_wait = now
        deadline = None if seconds is None else self.conn.read_deadline
        if deadline is not None:
            deadline.arm(seconds)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if deadline is not None:
                deadline.disarm()

    def _timed_out(self) -> None:
        armed = self._armed
        if armed is None:
            self._fail(UpstreamError(f"the replica sent nothing for {self._timeout}s"))
            return
        now = time.monotonic()
        progressed = self.patience.progressed_since(self._period_start)
        if progressed and not self.started and (self._timeout is None or now - self._first_wait < self._timeout):
            self._period_start = now  # working (on this request, or others before it): wait another period
            self.conn.read_deadline.arm(armed)
            return
        what = "its first bytes" if not self.started else "the next bytes of its answer"
        self._fail(DeadlineMissed(f"the replica sent {what} not within {armed:g}s"
                                  + (" (it was working on others)" if progressed else " and showed no progress"),
                                  first_byte=not self.started, progressed=progressed))

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        """The body bytes that arrived since the last call (at least one byte), StopAsyncIteration at its end."""
        while not self.chunks:
            if self.complete:
                raise StopAsyncIteration
            if self.error is not None:
                raise self.error
            await self._wait()
        return self._take()

    def ready(self) -> bytes | None:
        """``__anext__`` without waiting: the body bytes that arrived since the last call, None when none did."""
        return self._take() if self.chunks else None

    def _take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self._drain())
        self.started = True
        if self.paused:
            self.paused = False
            self.conn.transport.resume_reading()
        return data

    def _drain(self):
        while self.chunks:
            yield self.chunks.popleft()

    async def read(self) -> bytes:
        """The whole remaining body."""
        return b"".join([chunk async for chunk in self])

    def release(self) -> None:
        """The body was read: the connection goes back to the pool (closed if it cannot be reused; kept
        for ``_LINGER_S`` first if the end of the message has not arrived yet)."""
        if self._done:
            return
        self._done = True
        conn = self.conn
        if not self.complete and self.error is None and not conn.closed and not self.paused:
            # a stream read up to its [DONE]: the end of the message (the last chunk) is usually in flight
            self.lingering = asyncio.get_running_loop().call_later(_LINGER_S, self._give_up)
            return
        conn.response = None
        if self.complete and self.keep_alive and self.error is None and not conn.closed:
            conn.keep(conn)
        else:
            conn.transport.close()

    def _give_up(self) -> None:
        self.lingering = None
        self.conn.response = None
        self.conn.transport.close()

    def close(self) -> None:
        """Abandon the answer: the connection closes, so the replica sees the client leave."""
        if self.lingering is not None:
            self.lingering.cancel()
            self.lingering = None
        if self._done:
            return
        self._done = True
        self.conn.response = None
        self.conn.transport.close()
