"""Each source's turn at the subscriber's I/O thread: its live messages read, checked and delivered.

``FeedLoop`` (feed_loop.py) hands every ready SUB socket to ``SourceTurns.read``. A turn reads for at
most ``source_turn_s`` (at least one message, at most ``MESSAGES_PER_TURN``), so one busy socket cannot
hold the thread from the others. A source whose decoding and applying took more than its
``source_busy_share`` of the thread (``FrameGuard.busy_wait_s``), or whose message a degraded budget
refused (``FrameGuard.admit``), is not read until it paid that back: a socket of its own is paused (left
out of the poller, the flood waiting in its publisher); on a socket shared by many sources its messages
are dropped unread.
"""

from __future__ import annotations

import time

import zmq
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.subscribe.feed import Feed
from kvmesh.events.subscribe.frame_guard import FrameGuard
from kvmesh.events.subscribe.replay_requests import MESSAGES_PER_TURN
from kvmesh.events.subscribe.tracker import SourceTracker
from kvmesh.events.wire import unpack_seq

_NOBLOCK = int(zmq.NOBLOCK)  # a plain int skips pyzmq's enum arithmetic on the hot path
_PAUSE_S = (0.05, 1.0)  # shortest and longest pause of a source's socket over its budget


class SourceTurns:
    """Reads ``FeedLoop``'s SUB sockets fairly and pauses the ones over budget (see the module doc)."""

    def __init__(self, config: SubscriberConfig, poller: zmq.Poller, trackers: dict[str, SourceTracker],
                 active: dict[str, float], guard: FrameGuard) -> None:
        self._config, self._poller, self._guard = config, poller, guard
        self._trackers = trackers
        """The I/O loop's trackers (source name -> SourceTracker), shared, not copied."""
        self._active = active
        """The I/O loop's source name -> last time it sent us anything, shared, not copied."""
        self.paused: dict[Feed, float] = {}
        """Feeds not polled (a source over its budget) -> until when."""

    def read(self, feed: Feed) -> None:
        """One turn of ``feed``'s SUB socket (ready): its messages until the turn ends or it is paused."""
        sock, guard = feed.sock, self._guard
        turn_ends = time.perf_counter() + self._config.source_turn_s
        for _ in range(MESSAGES_PER_TURN):
            if not feed.shared:  # a socket of its own: over its share, it waits in its publisher
                wait = guard.busy_wait_s(next(iter(feed.topics)))
                if wait > 0:
                    self._trackers[next(iter(feed.topics))].stats.busy_pauses += 1
                    self._pause(feed, wait)
                    return
            try:
                frames = sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            started = time.perf_counter()
            feed.last_message = time.monotonic()
            name = feed.owner(frames[0]) if frames else None
            tracker = self._trackers.get(name) if name is not None else None
            if tracker is None:
                guard.warn_once(feed.address, "message for an unknown topic", f"{frames[0][:40]!r}")
                continue
            if feed.shared and guard.busy_wait_s(name) > 0:  # one socket, many sources: drop its, unread
                tracker.stats.busy_pauses += 1
                continue
            more = self._on_message(feed, name, tracker, frames)
            guard.spend(name, time.perf_counter() - started)
            if not more or time.perf_counter() >= turn_ends:
                return  # the other sockets' turn; this one is still ready at the next poll

    def _on_message(self, feed: Feed, name: str, tracker: SourceTracker, frames: list[bytes]) -> bool:
        """One live message of ``name``: checked, decoded and delivered (or counted as bad). False when
        the feed was paused (read no more of it now)."""
        if len(frames) != 3 or len(frames[1]) != 8:
            self._guard.bad_frame(name, "decode_errors", "bad frames",
                                  f"{len(frames)} frames; expected [topic, seq (8 bytes), payload]")
            return True
        self._active[name] = feed.last_message
        payload = frames[2]
        if not self._guard.admit(name, len(payload)):
            if not feed.shared:  # a socket of its own: leave the flood in the publisher's queue
                self._pause(feed, self._guard.refused_for_s(name, len(payload)))
                return False
            return True
        batch = self._guard.decode(name, payload)
        if batch is not None:
            tracker.on_live(unpack_seq(frames[1]), batch, len(payload))
        return True

    def _pause(self, feed: Feed, seconds: float) -> None:
        """Stop reading ``feed`` for ``seconds`` (within ``_PAUSE_S``): the flood waits in its publisher."""
        self._poller.unregister(feed.sock)
        self.paused[feed] = time.monotonic() + min(_PAUSE_S[1], max(_PAUSE_S[0], seconds))

    def resume_due(self) -> None:
        """Poll again the paused feeds whose pause is over."""
        now = time.monotonic()
        for feed in [f for f, until in self.paused.items() if now >= until]:
            del self.paused[feed]
            self._poller.register(feed.sock, zmq.POLLIN)

    def forget(self, feed: Feed) -> None:
        """Stop reading ``feed`` for good: its SUB socket leaves the poller (a paused one has already)."""
        if self.paused.pop(feed, None) is None:
            self._poller.unregister(feed.sock)
