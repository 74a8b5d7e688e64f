"""The one thing ZeroMQ's limits cannot bound: a multipart message that never ends.

ZeroMQ hands a message over only once its last frame arrived, and counts its high-water mark in
whole messages, so a peer that speaks raw ZMTP and keeps sending frames flagged MORE makes the
receiving process hold every frame: +570 MB per second on a SUB with RCVHWM 8 and MAXMSGSIZE 1 MiB
(issue 23). Nothing in the socket API shows such a half-received message, but the process's memory
does. ``MemoryWatch`` samples this process's RSS every ``INTERVAL_S``; once it grew by ``limit_bytes``
over its lowest point since the last alarm, the connections of our own that delivered no message
since the previous sample are the suspects -- an honest busy source keeps sending, an honest idle one
costs only a reconnect and a resync. The caller cuts them off for a while (``Feed.detach``: ZeroMQ
frees what it held for them; the wait doubles for a peer that keeps earning it) and counts a bad frame; the baseline is then taken afresh, so growth for other reasons (which this
cannot tell apart) raises the alarm at most once per ``limit_bytes``.
"""

from __future__ import annotations

import os
import time

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
INTERVAL_S = 0.1
"""Seconds between two RSS samples."""


def rss_bytes() -> int | None:
    """This process's resident memory (Linux /proc); None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class MemoryWatch:
    """See the module doc. ``limit_bytes`` 0 disables it."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._base = rss_bytes() if limit_bytes else None
        self._next = self._last = 0.0

    def suspects(self, feeds) -> list:
        """Feeds (``feed.Feed``) to reset now: empty unless the RSS grew past the limit."""
        if self._base is None:
            return []
        now = time.monotonic()
        if now < self._next:
            return []
        self._next, since = now + INTERVAL_S, self._last
        self._last = now
        rss = rss_bytes()
        if rss is None or rss - self._base < self.limit_bytes:
            self._base = min(self._base, rss) if rss is not None else self._base
            return []
        self._base = rss
        return [feed for feed in feeds if not feed.shared and feed.down_since is None and feed.last_message < since]
