"""One SUB socket of the subscriber: how it is opened, the sources it carries, the state of its connection.

A connection of our own (not a bound address) is watched through a monitor socket. ZeroMQ reconnects
by itself after a connection error, and says so (``EVENT_CONNECT_RETRIED``) -- but not after a
protocol error, e.g. a message over MAXMSGSIZE: that connection stays down for good. ``watch`` notes
a drop that ZeroMQ does not retry, and ``reattach`` connects again once ``REATTACH_S`` passed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.endpoints import Endpoint, attach
from kvmesh.events.subscribe.conn_bytes import ConnectionBytes

REATTACH_S = 0.3
"""Seconds a dropped connection that ZeroMQ does not retry waits before we connect again."""
DETACH_S = (0.5, 30.0)
"""First and longest wait before a connection we cut off (``detach``) is made again; doubles per cut
in a row, so a peer that keeps earning it is connected less and less often."""
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
MONITORED = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
             | HANDSHAKE_FAILED)


class Feed:
    """One SUB socket and the sources it carries (one, or several on a bound address)."""

    def __init__(self, sock: zmq.Socket, address: str, shared: bool, server_key: str | None) -> None:
        self.sock, self.address, self.shared, self.server_key = sock, address, shared, server_key
        self.monitor: zmq.Socket | None = None
        self.dropped = False  # the connection went down since it last came up
        self.down_since: float | None = None if shared else time.monotonic()
        """``time.monotonic()`` since when a connection of our own is not up (None: up, or bound)."""
        self.topics: dict[str, bytes] = {}  # source name -> topic
        self.reattach_at: float | None = None
        """When to connect again a dropped connection that ZeroMQ does not retry (None: none is)."""
        self.last_message = time.monotonic()
        """When the last whole message arrived (or the feed was made)."""
        self.bytes = ConnectionBytes()
        """What the connection received and ZeroMQ has not handed over yet (conn_bytes.py)."""
        self.detached = False
        """We cut the connection off (``detach``) and connect again at ``reattach_at``."""
        self.refused: str | None = None
        """Why the publisher refused our last handshake (``refusal``); None: it did not. Its drops are no bad
        frames and its reconnections no reconnections: nothing ever got through."""
        self._cuts = (0, 0.0)  # cuts in a row (no whole message since), time of the last one

    @classmethod
    def open(cls, ctx: zmq.Context, config: SubscriberConfig, ep: Endpoint, server_key: str | None,
             secure: Callable[[zmq.Socket, str | None], None]) -> Feed:
        """A SUB socket on ``ep``, made a CURVE client of ``server_key`` by ``secure`` (nothing for a plain one)."""
        sock = ctx.socket(zmq.SUB)
        # What a publisher can make us hold: RCVHWM messages of at most MAXMSGSIZE per frame
        # (SubscriberConfig.max_source_queue_bytes); beyond it ZeroMQ stops reading its socket.
        sock.setsockopt(zmq.RCVHWM, config.queue_messages())
        sock.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, config.reconnect_ivl_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, config.reconnect_ivl_max_ms)
        feed = cls(sock, ep.address, ep.bind, server_key)
        try:
            secure(sock, server_key)
            if not ep.bind:  # a connection of our own: watch it come up (monitored before it
                # connects, so its first "connected" is seen), drop and come back
                feed.monitor = sock.get_monitor_socket(MONITORED)
            feed.address = attach(sock, ep)
        except Exception:
            feed.close()
            raise
        return feed

    def close(self) -> None:
        """Close the socket and its monitor."""
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
        self.sock.close(linger=0)

    def watch(self, event: int, value: int = 0) -> bool:
        """Note one monitor event (``value``: its value; the connection's descriptor when it connected);
        True when a connection that had dropped is up again."""
        if event == zmq.EVENT_CONNECTED:
            self.bytes.connected(value)
        elif event == zmq.EVENT_DISCONNECTED:
            self.bytes.disconnected()
        if self.detached:
            return False  # our own cut: we connect again ourselves
        if event & HANDSHAKE_FAILED:
            self.refused = self.refusal(event, value)
            return False
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and self.refused is not None:
            self.refused = None  # the publisher admits us now (restarted without CURVE, or with our key)
            return True
        if event == zmq.EVENT_DISCONNECTED:
            self.dropped = True
            if self.down_since is None:
                self.down_since = time.monotonic()
            self.reattach_at = time.monotonic() + REATTACH_S
        elif event == zmq.EVENT_CONNECT_RETRIED:
            self.reattach_at = None  # ZeroMQ is on it
        elif event == zmq.EVENT_CONNECTED:
            self.down_since = self.reattach_at = None
            if self.dropped and self.refused is None:
                self.dropped = False
                return True
        return False

    def refusal(self, event: int, value: int) -> str:
        """What a failed handshake means, for people."""
        if self.server_key is None and (event != zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                        or value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH):
            return (f"{self.address} refused our handshake: its stream is private (CURVE) and we hold no key "
                    "for it")
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH or value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return f"{self.address} refused our CURVE handshake: it does not admit our key (or is not private)"
        return f"{self.address} failed the ZeroMQ handshake (protocol error {value:#x}): is it a ZeroMQ publisher?"

    def reattach(self) -> None:
        """Connect again (ZeroMQ gave the connection up after a protocol error, or we cut it off)."""
        self.reattach_at, self.detached = None, False
        self.dropped = True  # the next "connected" is a reconnection: its sources resync
        try:
            self.sock.disconnect(self.address)
        except zmq.ZMQError:
            pass  # already forgotten by ZeroMQ
        self.sock.connect(self.address)

    def detach(self) -> float:
        """Cut the connection off now (ZeroMQ frees what it held for it) and connect again later;
        returns the wait (``DETACH_S``, doubling while no whole message arrives in between)."""
        now = time.monotonic()
        cuts, last = self._cuts
        cuts = cuts + 1 if self.last_message < last else 1
        self._cuts = (cuts, now)
        wait = min(DETACH_S[1], DETACH_S[0] * 2 ** (cuts - 1))
        try:
            self.sock.disconnect(self.address)
        except zmq.ZMQError:
            pass
        self.bytes.disconnected()
        self.detached, self.dropped, self.reattach_at = True, True, now + wait
        if self.down_since is None:
            self.down_since = now
        return wait

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
