"""What ZeroMQ holds for one connection of ours, counted at the connection: bytes in, whole messages out.

ZeroMQ hands a message over only once its last frame arrived, and counts its high-water mark in
whole messages, so a peer that speaks raw ZMTP and keeps sending frames flagged MORE makes the
receiving process hold every frame (+570 MB/s on a SUB with RCVHWM 8). Nothing in the
socket API shows such a half-received message -- but the kernel counts every byte a TCP connection
received (``TCP_INFO``'s ``tcpi_bytes_received``) and ZeroMQ's monitor names each connection's file
descriptor. ``ConnectionBytes`` reads that count: what arrived since the connection last delivered a
whole message is what ZeroMQ (and the kernel's receive buffer) holds for it. While it delivers,
the count starts afresh at each check; a connection that has received more than
``SubscriberConfig.max_connection_bytes`` without delivering is cut off (``Feed.detach``): ZeroMQ frees
the message, and ``release_freed_memory`` gives the pages back to the system once it has.

This replaces watching the process's RSS: memory the process spends for any other reason --
HTTP bodies, the index, the allocator keeping freed pages -- is never charged to an event source, and
the source that is charged is the one whose connection holds the bytes. Counted: the connections we
make over TCP on Linux, to a publisher's PUB (feed_loop.py) and to its replay socket (replay_requests.py:
an answer that never ends gives the request up). Not counted (no per-connection count, or not ours to
cut): ipc/inproc, and the publishers that connect to a bound address.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import struct
import time

CHECK_S = 0.02
"""Seconds between two counts of a connection (the most bytes it can take past its bound is what it
receives in this time)."""
TRIM_AFTER_S = 0.5
"""Seconds after a cut before the freed memory is given back (ZeroMQ's I/O thread frees it meanwhile)."""
_TCP_INFO_BYTES_RECEIVED = 128
"""Offset of ``tcpi_bytes_received`` (u64) in Linux's ``struct tcp_info`` (since Linux 4.1)."""
_TCP_INFO_LEN = _TCP_INFO_BYTES_RECEIVED + 8


def tcp_bytes_received(fd: int) -> int | None:
    """Bytes the TCP connection on ``fd`` has received so far (None: not a TCP socket, or not Linux)."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    try:
        sock = socket.socket(fileno=fd)  # borrows the descriptor: detached below, never closed
    except OSError:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    finally:
        sock.detach()
    if len(info) < _TCP_INFO_LEN:
        return None
    return struct.unpack_from("=Q", info, _TCP_INFO_BYTES_RECEIVED)[0]


def _peer(fd: int) -> object:
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        return sock.getpeername()
    except OSError:
        return None
    finally:
        sock.detach()


class ConnectionBytes:
    """The byte count of one connection (see the module doc); its owner tells it when the connection
    comes and goes (``connected`` / ``disconnected``, from ZeroMQ's monitor) and ``check``s it."""

    __slots__ = ("_fd", "_peer", "_mark", "held")

    def __init__(self) -> None:
        self._fd: int | None = None
        self._peer: object = None  # the connection's peer, so a descriptor reused by another is noticed
        self._mark = 0
        self.held = 0
        """Bytes received since the connection last delivered a whole message (at the last check)."""

    @property
    def counted(self) -> bool:
        """Whether a connection is up and can be counted."""
        return self._fd is not None

    def connected(self, fd: int) -> None:
        """A connection came up on ``fd``."""
        received = tcp_bytes_received(fd)
        if received is None:
            self.disconnected()
            return
        self._fd, self._peer, self._mark, self.held = fd, _peer(fd), received, 0

    def disconnected(self) -> None:
        self._fd, self._peer, self.held = None, None, 0

    def check(self, delivered: bool) -> int:
        """``held`` now; ``delivered``: whether the connection delivered a whole message since the
        last check (then the count starts afresh: what is held is at most what came since)."""
        if self._fd is None:
            return 0
        received = tcp_bytes_received(self._fd)
        if received is None or _peer(self._fd) != self._peer:  # closed, or the number is another's now
            self.disconnected()
            return 0
        if delivered or received < self._mark:
            self._mark = received
        self.held = received - self._mark
        return self.held


class CountClock:
    """When an owner of counted connections counts them (every ``CHECK_S``), and gives back the memory of
    those it cut off (``TRIM_AFTER_S`` later)."""

    __slots__ = ("checks", "_next", "_last", "_trim_at")

    def __init__(self) -> None:
        self._next = self._last = 0.0
        self._trim_at: float | None = None
        self.checks = 0
        """Counts so far."""

    def due(self) -> float | None:
        """If a count is due now: the time of the previous one (whole messages delivered since then mean
        the count starts afresh); None otherwise. Gives back freed memory when that is due."""
        now = time.monotonic()
        if self._trim_at is not None and now >= self._trim_at:
            self._trim_at = None
            release_freed_memory()
        if now < self._next:
            return None
        since, self._last, self._next = self._last, now, now + CHECK_S
        self.checks += 1
        return since

    def cut(self) -> None:
        """A connection was cut off: give its memory back once ZeroMQ freed it."""
        self._trim_at = time.monotonic() + TRIM_AFTER_S


_LIBC = None


def release_freed_memory() -> None:
    """Give the pages the allocator keeps for freed memory back to the system (glibc's ``malloc_trim``;
    nothing elsewhere). Without it a cut-off message's ~100 MB stays in the process's RSS for good."""
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
    trim = getattr(_LIBC, "malloc_trim", None) if _LIBC else None
    if trim is not None:
        trim(0)
