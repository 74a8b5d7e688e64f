"""The router's client to its replicas: keep-alive HTTP/1.1 connections per replica, parsed by httptools.

    pool = UpstreamPool(connect_timeout_s=2, read_timeout_s=600)
    response = await pool.post("http://replica:8000", "/v1/completions", body, {"authorization": ...})
    response.status, response.headers["content-type"]
    async for chunk in response: ...      # the body's bytes as they arrive (chunked encoding removed)
    response.release()                     # read to the end: the connection goes back to the pool
    response.close()                       # abandoned: the connection closes (the replica aborts the request)

Failures raise ``UpstreamError``; one to connect (refused, unreachable, connect timeout) raises its
subclass ``UpstreamConnectError``, which the forwarder takes as "the replica is down". A pooled
connection the replica closed while it sat idle (its keep-alive timeout, or it died) is noticed when
writing the request fails, or when the connection ends before any byte of the answer arrived; the
idle connections beside it are dropped and the request goes once more on a fresh connection: a
replica closes an idle connection without reading what arrives on it, so nothing ran twice. A fresh
connection closed before the request was written raises ``UpstreamConnectError`` (the forwarder
tries another replica); one closed after it, before any answer byte, ``UpstreamError`` (likewise).
``read_timeout_s`` bounds each wait for the next bytes (aiohttp's ``sock_read``). Every socket has
TCP_NODELAY.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kvmesh.router.http.upstream_connection import (
    DeadlineMissed,
    StaleConnection,
    UpstreamConnectError,
    UpstreamConnection,
    UpstreamError,
    UpstreamResponse,
)

if TYPE_CHECKING:
    from kvmesh.router.replicas.patience import Patience

__all__ = ["DeadlineMissed", "UpstreamConnectError", "UpstreamError", "UpstreamPool", "UpstreamResponse",
           "header_lines"]

_MAX_HEADS = 256
"""Request lines kept made (per method, replica and path: the proxied paths, the probes); past it they start over."""
_IDLE_S = 15.0
"""Idle pooled connections older than this are dropped (replicas close theirs after 30 s by default)."""


def header_lines(headers: dict[str, str]) -> str:
    """``headers`` as the lines of a request head (``name: value\\r\\n`` each), in their order."""
    if not headers:
        return ""
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items())


class UpstreamPool:
    """Keep-alive connections per replica address (see the module doc)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float | None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: dict[tuple, list[UpstreamConnection]] = {}
        self._addresses: dict[str, tuple] = {}
        self._heads: dict[tuple[str, str, str], tuple[tuple, str]] = {}
        """(method, base URL, path) -> its address and the request line with the Host header, made once."""
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

    def post(self, base_url: str, path: str, body: bytes, headers: dict[str, str] | str,
             patience: Patience | None = None) -> Coroutine[None, None, UpstreamResponse]:
        """Send ``POST path`` with a JSON ``body`` and ``headers`` (a dict, or its ``header_lines``); awaited, the
        response once its status and headers arrived (within ``patience``'s first-byte deadline:
        router/replicas/patience.py). ``request``'s coroutine itself, without one more around it."""
        return self.request("POST", base_url, path, body, headers, patience)

    async def fetch(self, method: str, base_url: str, path: str, timeout_s: float, body: bytes = b"",
                    headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """A whole answer (status, headers, body) within ``timeout_s`` (the probes, a worker's control router)."""
        async def whole() -> tuple[int, dict[str, str], bytes]:
            response = await self.request(method, base_url, path, body, headers or {})
            try:
                data = await response.read()
            except BaseException:
                response.close()
                raise
            response.release()
            return response.status, response.headers, data

        return await asyncio.wait_for(whole(), timeout_s)

    async def request(self, method: str, base_url: str, path: str, body: bytes,
                      headers: dict[str, str] | str, patience: Patience | None = None) -> UpstreamResponse:
        """Send ``method path`` with ``body`` and ``headers`` (a dict, or its ``header_lines``); the response once its
        status and headers arrived."""
        found = self._heads.get((method, base_url, path))
        if found is None:
            if len(self._heads) >= _MAX_HEADS:  # paths passed through from a client (a worker's admin plane)
                self._heads.clear()
            key = self._address(base_url)
            head = f"{method} {path} HTTP/1.1\r\nHost: {key[3].decode()}\r\n"
            found = self._heads[method, base_url, path] = key, head
        key, head = found
        extra = headers if isinstance(headers, str) else header_lines(headers)
        request = f"{head}Content-Length: {len(body)}\r\n{extra}\r\n".encode("latin-1") + body
        conn = self._take(key)
        if conn is not None:
            response = await self._send(conn, request, patience)
            if response is not None:
                return response
            self._drop_idle(key)  # found closed: those idle beside it likely are too (restarted, or died)
        conn = await self._connect(key)
        return await self._send(conn, request, patience)

    async def _send(self, conn: UpstreamConnection, request: bytes,
                    patience: Patience | None) -> UpstreamResponse | None:
        """Write ``request`` on ``conn`` and wait for the answer's head; None when ``conn`` was a pooled one
        found closed (nothing ran: the request goes again on a fresh one)."""
        response = UpstreamResponse(conn, self.read_timeout_s, patience)
        conn.response = response
        try:
            conn.transport.write(request)
        except (RuntimeError, OSError):  # closed under us (uvloop raises; asyncio drops the bytes)
            response.close()
            if conn.reused:
                return None
            host, port = conn.key[:2]  # nothing was sent: the replica is gone, another one may answer
            raise UpstreamConnectError(f"the connection to {host}:{port} closed before the request was sent") from None
        try:
            while response.status == 0:  # until the answer's head arrived
                if response.error is not None:
                    raise response.error
                await response._wait()
        except StaleConnection:
            return None
        except asyncio.CancelledError:
            response.close()
            raise
        except UpstreamError:
            response.close()
            raise
        return response

    def _drop_idle(self, key: tuple) -> None:
        for conn in self._idle.pop(key, ()):
            conn.transport.close()

    def _take(self, key: tuple) -> UpstreamConnection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.transport.is_closing() and now - conn.idle_since < _IDLE_S:
                conn.reused = True
                return conn
            conn.transport.close()
        return None

    async def _connect(self, key: tuple) -> UpstreamConnection:
        host, port, https, _ = key
        loop = asyncio.get_running_loop()
        if https and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConnection(key, self.put, self.forget), host, port,
                                       ssl=self._ssl if https else None), self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise UpstreamConnectError(f"no connection to {host}:{port} within {self.connect_timeout_s}s") from None
        except OSError as e:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {e}") from None
        self.connections_made += 1
        return conn

    def put(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` for the next request to its replica (its answer was read to the end)."""
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        """Drop ``conn`` from the idle ones (it closed)."""
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        """Close every idle connection (those in use close when their answer is let go)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()
