"""The subscriber's feed: the loop of its I/O thread over every SUB and DEALER socket, live frames parsed.

Runs on one thread, which owns every socket; other threads talk to it through ``call``
(a command deque plus an inproc wake-up socket). SUB sockets are ``Feed``s (feed.py), replay and
snapshot requests ``ReplayRequests`` (replay_requests.py), bad frames ``FrameGuard``'s (frame_guard.py).

Sources are served fairly: each turn of the loop reads every ready socket for at most
``source_turn_s`` (at least one message), and a source whose decoding and applying took more than its
``source_busy_share`` of the thread is not read until it paid that back (its socket is left alone: the
flood waits in its publisher); ``SourceTurns`` (source_turns.py) reads and pauses. What a connection of ours received
and ZeroMQ has not handed over is
counted every ``conn_bytes.CHECK_S`` (also the longest the loop sleeps while there is one to count);
past ``max_connection_bytes`` it is cut off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Literal

import zmq
from kvmesh.events import curve
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.endpoints import parse_sub_endpoint
from kvmesh.events.subscribe.conn_bytes import CHECK_S, CountClock
from kvmesh.events.subscribe.consumer import BatchCallback, StatusCallback
from kvmesh.events.subscribe.feed import Feed
from kvmesh.events.subscribe.frame_guard import FrameGuard
from kvmesh.events.subscribe.health import REFUSED
from kvmesh.events.subscribe.replay_requests import ReplayRequests
from kvmesh.events.subscribe.source_turns import SourceTurns
from kvmesh.events.subscribe.tracker import SourceTracker
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger(__name__)
Command = tuple[Literal["add"], PublisherSource] | tuple[Literal["remove", "resync"], str] | None
"""What ``FeedLoop.call`` queues for the I/O thread (None: stop)."""


class FeedLoop:
    """Owns the sockets; see the module doc. Replay/snapshot requests: ``self.requests``
    (``ReplayRequests``); bad frames and source health: ``self.guard`` (``FrameGuard``)."""

    def __init__(self, ctx: zmq.Context, config: SubscriberConfig, deliver: BatchCallback,
                 status: StatusCallback) -> None:
        self._ctx, self._config = ctx, config
        self.trackers: dict[str, SourceTracker] = {}
        self.bound: dict[str, str] = {}
        self._sources: dict[str, PublisherSource] = {}
        self._feeds: dict[str, Feed] = {}  # key: source name, or "bind:" + address when shared
        self._by_socket: dict[zmq.Socket, Feed] = {}  # SUB and monitor sockets -> their feed
        self._feed_of: dict[str, Feed] = {}
        self._keypair: tuple[str, str] | None = None  # our CURVE keypair, made on first use
        self.crash: BaseException | None = None
        """What stopped the loop, when it stopped for anything but ``call(None)``."""
        self._to_start: list[str] = []
        self._active: dict[str, float] = {}  # source -> last time it sent us anything
        self.counts = CountClock()
        """When the connections' bytes are counted (conn_bytes.py)."""
        self._poller = zmq.Poller()
        self.guard = FrameGuard(config, self.trackers, deliver, status)
        self.requests = ReplayRequests(ctx, config, self._poller, self._sources, self.trackers, self._active,
                                       self.guard, lambda sock, src: self.secure(sock, self.server_key(src)))
        self.turns = SourceTurns(config, self._poller, self.trackers, self._active, self.guard)
        self._calls: deque[Command] = deque()
        addr = f"inproc://kvmesh-subscriber-wake-{id(self)}-{time.monotonic_ns()}"
        self._wake_recv = ctx.socket(zmq.PULL)
        self._wake_recv.bind(addr)
        self._wake_send = ctx.socket(zmq.PUSH)
        self._wake_send.setsockopt(zmq.LINGER, 0)
        self._wake_send.connect(addr)
        self._wake_lock = threading.Lock()
        self._poller.register(self._wake_recv, zmq.POLLIN)
        self._running = True

    # -- commands (any thread) --------------------------------------------------------------------
    def call(self, command: Command) -> None:
        """Queue ``("add", source)``, ``("remove", name)``, ``("resync", name)`` or ``None`` (stop)."""
        self._calls.append(command)
        with self._wake_lock:  # zmq sockets are not thread-safe; callers may be many threads
            try:
                self._wake_send.send(b"", zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                pass

    def _run_calls(self) -> None:
        while self._calls:
            cmd = self._calls.popleft()
            try:
                if cmd is None:
                    self._running = False
                elif cmd[0] == "add":
                    self.add_source(cmd[1])
                elif cmd[0] == "remove":
                    self._remove_source(cmd[1])
                elif cmd[0] == "resync" and cmd[1] in self.trackers:
                    self.trackers[cmd[1]].resync()
            except Exception as e:  # a bad source must not stop the others
                logger.error("KV event subscriber: %s %r failed: %s", cmd[0], cmd[1], e)

    # -- sources ----------------------------------------------------------------------------------
    def add_source(self, src: PublisherSource) -> None:
        """Follow ``src``; a source of the same name is replaced (or kept, if identical)."""
        if src.name in self._sources:
            if self._sources[src.name] == src:
                return
            self._remove_source(src.name)
        ep = parse_sub_endpoint(src.endpoint)
        key = f"bind:{ep.address}" if ep.bind else src.name
        feed = self._feeds.get(key)
        server_key = self.server_key(src)
        if feed is not None and feed.server_key != server_key:
            raise ValueError(f"source {src.name!r} shares the bound address {ep.address} with sources of "
                             "another CURVE server key; one bound socket has one key")
        if feed is None:
            feed = self._feeds[key] = Feed.open(self._ctx, self._config, ep, server_key, self.secure)
            for sock in (feed.sock, feed.monitor):
                if sock is not None:
                    self._by_socket[sock] = feed
                    self._poller.register(sock, zmq.POLLIN)
        feed.topics[src.name] = src.topic.encode()
        feed.sock.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
        self._feed_of[src.name] = feed
        if ep.bind:
            self.bound[src.name] = feed.address
        self._sources[src.name] = src
        self.trackers[src.name] = SourceTracker(
            src.name, self.guard.deliver, self.requests.request, self.guard.tracker_status,
            has_replay=src.replay_endpoint is not None, max_pending=self._config.max_pending,
            max_pending_bytes=self._config.max_pending_bytes,
        )
        self._to_start.append(src.name)
        self._active[src.name] = time.monotonic()

    def server_key(self, src: PublisherSource) -> str | None:
        """The CURVE server key ``src`` is followed with (None: plain)."""
        return src.curve_server_key or self._config.curve_server_key

    def secure(self, sock: zmq.Socket, server_key: str | None) -> None:
        """Make ``sock`` a CURVE client of ``server_key`` (nothing for a plain source)."""
        if server_key is None:
            return
        if self._keypair is None:
            cfg = self._config
            self._keypair = ((cfg.curve_public_key, cfg.curve_secret_key) if cfg.curve_public_key
                             else curve.generate_keypair())
        curve.make_client(sock, server_key, *self._keypair)

    def _remove_source(self, name: str) -> None:
        if self._sources.pop(name, None) is None:
            return
        self.trackers.pop(name, None)
        self._active.pop(name, None)
        self.bound.pop(name, None)
        self.requests.forget(name)
        self.guard.forget(name)
        feed = self._feed_of.pop(name)
        feed.topics.pop(name, None)
        if not feed.topics:
            self.turns.forget(feed)
            self._close_feed(feed)
            self._feeds = {k: f for k, f in self._feeds.items() if f is not feed}

    # -- loop -------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while self._running:
                self._run_calls()
                while self._to_start:
                    name = self._to_start.pop(0)
                    if name in self.trackers:
                        self.trackers[name].start(self._config.snapshot_on_start)
                timeout_ms = self.requests.poll_timeout_ms()
                if self.requests.dealers or any(not f.shared for f in self._feeds.values()):
                    timeout_ms = min(timeout_ms, int(CHECK_S * 1000))
                ready = dict(self._poller.poll(timeout_ms))
                for sock in ready:
                    if sock is self._wake_recv:
                        self._drain(sock)
                    elif sock in self.requests.dealer_owner:
                        self.requests.on_dealer(self.requests.dealer_owner[sock], sock)
                    else:
                        self._on_socket(sock)
                self.requests.tick()
                self.guard.check_health()
                if self.turns.paused:
                    self.turns.resume_due()
                self._reattach_feeds()
        except Exception as e:  # a bug here must not pass silently: EventSubscriber restarts the feed
            self.crash = e
            logger.exception("KV event subscriber I/O loop crashed; the feed will be restarted")
        finally:
            self.close_sockets()

    def close_sockets(self) -> None:
        """Close every socket; the trackers (and their stats) stay readable."""
        self.requests.close()
        for feed in {id(f): f for f in self._feeds.values()}.values():
            self._close_feed(feed)
        self._feeds.clear()
        self._wake_recv.close(linger=0)
        self._wake_send.close(linger=0)

    def _close_feed(self, feed: Feed) -> None:
        self._by_socket.pop(feed.sock, None)
        if feed.monitor is not None:
            self._by_socket.pop(feed.monitor, None)
            if feed.monitor in self._poller:
                self._poller.unregister(feed.monitor)
        feed.close()

    def _on_monitor(self, feed: Feed) -> None:
        while feed.monitor is not None and feed.monitor.poll(0):
            message = recv_monitor_message(feed.monitor)
            refused = feed.refused
            if feed.watch(message["event"], message["value"]):
                for name in list(feed.topics):
                    logger.info("KV events from %s: reconnected to %s", name, feed.address)
                    self.trackers[name].on_reconnect()
            if feed.refused is not None and refused is None:  # said once per refusal, not per attempt
                for name in list(feed.topics):
                    logger.warning("KV events from %s: %s", name, feed.refused)
                    self.guard.tracker_status(name, REFUSED, feed.refused)

    def _reattach_feeds(self) -> None:
        """Connect again what ZeroMQ gave up after a protocol error (a bad frame) or we cut off; cut off a
        connection holding more than ``max_connection_bytes`` without delivering (a bad frame too)."""
        now, feeds, bad = time.monotonic(), list(self._feeds.values()), []
        for feed in feeds:
            if feed.reattach_at is not None and now >= feed.reattach_at:
                if not feed.detached and feed.refused is None:  # a refused handshake is not the source's frame
                    bad.append((feed, "connection dropped by ZeroMQ", "a frame over max_message_bytes or bad framing"))
                feed.reattach()
        since = self.counts.due()
        if since is not None:
            limit = self._config.max_connection_bytes
            for feed in feeds:
                if feed.shared or feed.detached:
                    continue
                held = feed.bytes.check(delivered=feed.last_message >= since)
                if held > limit:
                    self.counts.cut()
                    bad.append((feed, "a message that never ends", f"{held >> 20} MiB received without a whole "
                                f"message (max_connection_bytes={limit >> 20} MiB): cut off for {feed.detach():g}s"))
        for feed, what, why in bad:
            for name in list(feed.topics):
                self.guard.bad_frame(name, "rejected", what, f"{feed.address}: {why}")

    @staticmethod
    def _drain(sock: zmq.Socket) -> None:
        try:
            while True:
                sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            pass

    # -- live messages ----------------------------------------------------------------------------
    def _on_socket(self, sock: zmq.Socket) -> None:
        feed = self._by_socket.get(sock)
        if feed is None:
            return
        if feed.sock is sock:
            self.turns.read(feed)
        else:
            self._on_monitor(feed)
