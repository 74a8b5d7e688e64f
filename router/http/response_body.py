"""A streamed response body written to a client (connection.py's ``send``, after the head).

Each chunk goes as it comes: chunk-encoded on HTTP/1.1, raw on HTTP/1.0 (where the connection's close ends it).
While the client reads slowly (the transport paused writing) the next chunk waits for it. The stream is closed
whatever happens, so its producer (a replica's answer) lets go of what it holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from kvmesh.router.http.messages import Client


async def write_stream(client: Client, stream: AsyncIterator[bytes], chunked: bool) -> None:
    """Write ``stream``'s chunks to ``client`` (``chunked``: in chunked transfer coding, ended by its last chunk)."""
    try:
        async for chunk in stream:
            if chunk:
                client.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                if client.paused:
                    await client.drain()
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    if chunked:
        client.write(b"0\r\n\r\n")
