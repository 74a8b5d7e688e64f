"""A client that leaves mid-call: its POST sent on a raw socket, nothing read, closed when the test says so."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit


def post_unread(url: str, path: str, body: dict, headers: dict[str, str] | None = None) -> socket.socket:
    """Send ``POST path`` with a JSON ``body`` to ``url`` (``http://host:port``) and return the socket, its answer
    unread: closing it is a client that gave up."""
    where = urlsplit(url)
    data = json.dumps(body).encode()
    merged = {"content-type": "application/json"} | {k.lower(): v for k, v in (headers or {}).items()}
    head = "".join(f"{k}: {v}\r\n" for k, v in merged.items())
    sock = socket.create_connection((where.hostname, where.port), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {where.hostname}\r\n{head}Content-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    return sock
