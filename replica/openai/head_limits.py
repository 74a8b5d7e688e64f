"""A request head's bounds, counted as its bytes arrive, before anything reads it: no key is checked, no body is
read and no header is handed on until the head fits. The one rule of the router's server (router/http/connection.py)
and the replica's (runner.py), both httptools parsers:

    bytes of one head (request line and headers)  > max_header_bytes        431, the connection closes
    header lines                                  > max_headers             431
    request target (path and query)               > max_request_line_bytes  414

httptools gathers a header's value in memory until its line ends (each piece joined to the last), so a head is
fed to the parser no further than its room: a 64 MB header costs ``max_header_bytes`` and the 431 goes out as
soon as the limit is passed, not when (if ever) the header ends.

    limits = HeadLimits(frontend)
    data_received:        for piece in limits.pieces(data):   raises ProtocolError (431/414)
                              with limits: parser.feed_data(piece)   or httptools' errors
                          (``limits.fits(data)``: fed whole, the usual case, without cutting)
    on_url / on_header:   limits.url(len(url)) / limits.header()
    on_headers_complete:  limits.head_done()          the body is not counted
    on_message_complete:  limits.message_done()       the next head counts from here
    refusal(error)        the whole answer (OpenAI-shaped, ``connection: close``), then ``linger(transport)``
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from http import HTTPStatus

import httptools
import msgspec
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.serving.errors import ProtocolError

LINGER_S = 1.0
"""Seconds a refused connection stays open, reading nothing, after its answer (``linger``)."""


class HeadLimits:
    """One connection's count of the head being read (see the module doc)."""

    __slots__ = ("config", "room", "heads", "headers", "url_bytes", "error", "refused")

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.room: int | None = config.max_header_bytes
        """Bytes the head being read may still take; None while a body is read."""
        self.heads = 0
        """Heads completed on the connection."""
        self.headers = 0
        self.url_bytes = 0
        self.error: ProtocolError | None = None
        """Why the head is refused, on its way out of a parser callback (httptools wraps what they raise)."""
        self.refused = False
        """A head was refused (or the input was malformed): nothing more is parsed."""

    def fits(self, data: bytes) -> bool:
        """Whether ``data`` goes to the parser whole (the usual case: within the head's room, or a body), counted
        here; else the caller feeds ``pieces(data)``."""
        room = self.room
        if self.refused or (room is not None and len(data) > room):
            return False
        if room is not None:
            self.room = room - len(data)
        return True

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """``data`` cut where a head would pass its room. The caller feeds each piece to its parser itself, inside
        ``with limits:`` (so the parser's callbacks come back to the caller's file, never through this one); raises
        the head's ``ProtocolError`` (431) when it did not end within its room. Once a head was refused, nothing more
        is given (what still arrives before the connection closes is dropped)."""
        if self.refused:
            return
        while data:
            room = self.room
            if room is None or len(data) <= room:
                if room is not None:
                    self.room = room - len(data)
                yield data
                return
            heads = self.heads
            yield data[:room]
            if self.heads == heads:  # the head did not end within its room
                self.refused = True
                raise ProtocolError(f"request headers exceed {self.config.max_header_bytes} bytes (the server's "
                                    "max_header_bytes)", 431)
            data = data[room:]

    def __enter__(self) -> HeadLimits:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        """A parser error on a piece: the head past a limit (the ``ProtocolError`` a callback raised, which httptools
        wraps) or malformed input; nothing more is parsed either way."""
        if kind is not None and issubclass(kind, httptools.HttpParserError):
            self.refused = True
            if self.error is not None:
                held, self.error = self.error, None  # held by nobody once answered (its frames hold the input)
                raise held from None

    def url(self, size: int) -> None:
        """A piece of the request target arrived (``size`` bytes)."""
        self.url_bytes += size
        if self.url_bytes > self.config.max_request_line_bytes:
            raise self._refuse(ProtocolError(
                f"request target exceeds {self.config.max_request_line_bytes} bytes (the server's "
                "max_request_line_bytes)", 414))

    def header(self) -> None:
        """A header line arrived."""
        self.headers += 1
        if self.headers > self.config.max_headers:
            raise self._refuse(ProtocolError(
                f"request has more than {self.config.max_headers} header lines (the server's max_headers)", 431))

    def head_done(self) -> None:
        self.room = None
        self.heads += 1

    def message_done(self) -> None:
        self.room = self.config.max_header_bytes
        self.headers = self.url_bytes = 0

    def _refuse(self, error: ProtocolError) -> ProtocolError:
        self.error = error
        return error


def refusal(error: ProtocolError) -> bytes:
    """The answer to a refused head: ``error`` OpenAI-shaped, and ``connection: close``."""
    body = msgspec.json.encode(error.to_dict())
    status = HTTPStatus(error.status_code)
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status.value, status.phrase.encode(), len(body))) + body


def linger(transport: asyncio.Transport) -> None:
    """Close ``transport`` once its client could read the refusal just written: reading stops (what the client still
    sends costs nothing), the write side ends now, and the connection closes after ``LINGER_S`` or when the client
    closes it. Closing at once, with the client's bytes unread, resets the connection, and a client that was still
    sending could lose the answer."""
    transport.pause_reading()
    if transport.can_write_eof():
        transport.write_eof()
    asyncio.get_running_loop().call_later(LINGER_S, transport.close)
