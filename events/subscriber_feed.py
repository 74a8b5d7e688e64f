"""One SUB socket of the subscriber and the sources it carries."""

from __future__ import annotations

import time

import zmq


class Feed:
    """One SUB socket and the sources it carries (one, or several on a bound address)."""

    def __init__(self, sock: zmq.Socket, address: str, shared: bool, server_key: str | None) -> None:
        self.sock, self.address, self.shared, self.server_key = sock, address, shared, server_key
        self.monitor: zmq.Socket | None = None
        self.dropped = False  # the connection went down since it last came up
        self.down_since: float | None = None if shared else time.monotonic()
        """``time.monotonic()`` since when a connection of our own is not up (None: up, or bound)."""
        self.topics: dict[str, bytes] = {}  # source name -> topic

    def owner(self, topic: bytes) -> str | None:
        if len(self.topics) == 1:
            return next(iter(self.topics))
        for name, t in self.topics.items():
            if topic == t:
                return name
        for name, t in self.topics.items():
            if topic.startswith(t):
                return name
        return None
