"""The router's client to its replicas: keep-alive HTTP/1.1 connections per replica, parsed by httptools.

    pool = UpstreamPool(connect_timeout_s=2, read_timeout_s=600)
    response = await pool.post("http://replica:8000", "/v1/completions", body, {"authorization": ...})
    response.status, response.headers["content-type"]
    async for chunk in response: ...      # the body's bytes as they arrive (chunked encoding removed)
    response.release()                     # read to the end: the connection goes back to the pool
    response.close()                       # abandoned: the connection closes (the replica aborts the request)

Failures raise ``UpstreamError``; one to connect (refused, unreachable, connect timeout) raises its
subclass ``UpstreamConnectError``, which the forwarder takes as "the replica is down". A pooled
connection the replica closed while it sat idle (its keep-alive timeout) is noticed when it ends
before any byte of the answer arrived, and the request goes once more on a fresh connection: a
replica closes an idle connection without reading what arrives on it, so nothing ran twice.
``read_timeout_s`` bounds each wait for the next bytes (aiohttp's ``sock_read``). Every socket has
TCP_NODELAY.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from urllib.parse import urlsplit

import httptools
from kvmesh.router.http.deadline import Deadline


class UpstreamError(Exception):
    """The replica connection failed (reset, closed early, timed out, bad HTTP)."""


class UpstreamConnectError(UpstreamError):
    """No connection could be made to the replica (refused, unreachable, connect timeout)."""


class _StaleConnection(UpstreamError):
    """A reused connection ended before any answer byte: the request is sent again on a fresh one."""


_IDLE_S = 15.0
"""Idle pooled connections older than this are dropped (replicas close theirs after 30 s by default)."""
_LINGER_S = 1.0
"""How long a released answer may take to end before its connection is closed rather than pooled."""
_HIGH_WATER = 64
"""Unread body chunks at which reading from the replica pauses (the client reads slower than it writes)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple) -> None:
        self.pool, self.key = pool, key
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
        self.pool._forget(self)
        r = self.response
        if r is not None and r.lingering is not None:
            r.lingering.cancel()
            r.lingering = None
        if r is not None and not r.complete:
            if r.status and "content-length" not in r.headers and "transfer-encoding" not in r.headers:
                r.complete = True  # a body delimited by the connection's end (HTTP/1.0 style)
                r._wake()
            elif self.reused and not r.received:
                r._fail(_StaleConnection("the pooled connection was closed by the replica"))
            else:
                r._fail(UpstreamError(f"the replica closed the connection before the answer ended ({exc!r})"))

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

    def __init__(self, conn: _Connection, read_timeout_s: float | None) -> None:
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
        """Until the connection has news (bytes, the end, a failure), at most ``read_timeout_s``."""
        self._waiter = asyncio.get_running_loop().create_future()
        deadline = None if self._timeout is None else self.conn.read_deadline
        if deadline is not None:
            deadline.arm(self._timeout)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if deadline is not None:
                deadline.disarm()

    def _timed_out(self) -> None:
        self._fail(UpstreamError(f"the replica sent nothing for {self._timeout}s"))

    async def _head(self) -> None:
        while self.status == 0:
            if self.error is not None:
                raise self.error
            await self._wait()

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
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self._drain())
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
            self.conn.pool._put(conn)
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


class UpstreamPool:
    """Keep-alive connections per replica address (see the module doc)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float | None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: dict[tuple, list[_Connection]] = {}
        self._addresses: dict[str, tuple] = {}
        self._ssl: ssl.SSLContext | None = None
        self.connections_made = 0
        """Connections opened so far (tests: reuse keeps this at one for sequential requests)."""

    def _address(self, base_url: str) -> tuple:
        """(host, port, https, Host header bytes) of a replica URL, parsed once."""
        found = self._addresses.get(base_url)
        if found is None:
            u = urlsplit(base_url)
            https = u.scheme == "https"
            port = u.port or (443 if https else 80)
            found = self._addresses[base_url] = (u.hostname, port, https, u.netloc.encode("idna"))
        return found

    async def post(self, base_url: str, path: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """Send ``POST path`` with a JSON ``body``; the response once its status and headers arrived."""
        key = self._address(base_url)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"POST {path} HTTP/1.1\r\nHost: {key[3].decode()}\r\nContent-Length: {len(body)}\r\n"
                   f"{extra}\r\n").encode("latin-1") + body
        for _ in range(3):  # a stale pooled connection: again on another
            conn = self._take(key)
            if conn is None:
                conn = await self._connect(key)
            response = UpstreamResponse(conn, self.read_timeout_s)
            conn.response = response
            conn.transport.write(request)
            try:
                await response._head()
            except _StaleConnection:
                continue
            except asyncio.CancelledError:
                response.close()
                raise
            except UpstreamError:
                response.close()
                raise
            return response
        raise UpstreamError("the replica closed three connections in a row without answering")

    def _take(self, key: tuple) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < _IDLE_S:
                conn.reused = True
                return conn
            conn.transport.close()
        return None

    async def _connect(self, key: tuple) -> _Connection:
        host, port, https, _ = key
        loop = asyncio.get_running_loop()
        if https and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self, key), host, port,
                                       ssl=self._ssl if https else None), self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise UpstreamConnectError(f"no connection to {host}:{port} within {self.connect_timeout_s}s") from None
        except OSError as e:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {e}") from None
        self.connections_made += 1
        return conn

    def _put(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)

    def _forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        """Close every idle connection (those in use close when their answer is let go)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()
