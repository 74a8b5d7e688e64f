"""HTTP/1.1 requests read off an asyncio stream, for the fake servers of tests and benchmarks: the request line,
the headers (names lower-cased) and a body by ``Content-Length`` or chunked. No more checking than they need."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes, dict[bytes, bytes], bytes]:
    """The next request's method, path (its query cut off), headers and body. Raises
    ``asyncio.IncompleteReadError`` when the client closed, ``ValueError`` on a malformed head."""
    head = await reader.readuntil(b"\r\n\r\n")
    method, path, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)}
    return method, path.split(b"?")[0], headers, await read_body(reader, headers)


async def read_body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> bytes:
    """A request's body: chunked (the chunks joined) or ``Content-Length`` bytes."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            parts.append(await reader.readexactly(size + 2))
            if not size:
                return b"".join(p[:-2] for p in parts)
    length = int(headers.get(b"content-length", b"0"))
    return await reader.readexactly(length) if length else b""
