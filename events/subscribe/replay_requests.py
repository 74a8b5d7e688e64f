"""The subscriber's replay and snapshot requests: one DEALER per publisher, one request in flight.

``FeedLoop`` holds one ``ReplayRequests`` (same thread). A request that gets no answer within its
timeout is given up and its DEALER replaced, so a late answer cannot be taken for the next
request's. Answers are read in both layouts (wire.py): vLLM 0.33's ``[b"", topic, seq, payload]``
and older vLLM's ``[b"", seq, payload]``; an end marker in answer to a snapshot request means
the source has no snapshots (a vLLM publisher reads the request as a start_seq beyond its end).

Back-off: a source whose recovery keeps needing new requests (e.g. a snapshot that is behind the
live seq: snapshot, replay, snapshot, ...) gets ``recovery_free_requests`` at once, then each
further request waits ``recovery_backoff_s``, doubling up to ``recovery_backoff_max_s``; the
streak ends when the source made no request for ``recovery_quiet_s`` plus twice its last delay.
A held-back request counts as in flight (its timeout starts when it is sent). A publisher over
its limits answers a snapshot request "busy": asked again after a back-off, never given up.

What ZeroMQ holds for each DEALER's connection is counted (conn_bytes.py, through a monitor socket
per DEALER): an answer that received ``max_connection_bytes`` without a whole message is given up,
its DEALER closed (ZeroMQ frees it) and counted as a bad frame -- a timeout alone would let it grow
for ``snapshot_timeout`` at the link's speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.endpoints import parse_sub_endpoint
from kvmesh.events.subscribe.conn_bytes import ConnectionBytes, CountClock
from kvmesh.events.subscribe.frame_guard import FrameGuard
from kvmesh.events.subscribe.snapshot_answer import SnapshotAnswers, SnapshotChunk, SnapshotFailure
from kvmesh.events.subscribe.tracker import REPLAY, SNAPSHOT, SourceTracker
from kvmesh.events.wire import END_SEQ, SNAPSHOT_REQUEST, SNAPSHOT_TAG, pack_seq, unpack_seq
from zmq.utils.monitor import recv_monitor_message

_NOBLOCK = int(zmq.NOBLOCK)  # a plain int skips pyzmq's enum arithmetic on the hot path
MESSAGES_PER_TURN = 512
"""Messages read per socket and loop turn, so one busy publisher cannot starve the others."""


class ReplayRequests:
    """The replay/snapshot requests of ``FeedLoop``'s sources and their answers."""

    def __init__(self, ctx: zmq.Context, config: SubscriberConfig, poller: zmq.Poller,
                 sources: dict[str, PublisherSource], trackers: dict[str, SourceTracker], active: dict[str, float],
                 guard: FrameGuard, secure: Callable[[zmq.Socket, PublisherSource], None]) -> None:
        self._ctx, self._config, self._poller = ctx, config, poller
        self._sources, self._trackers = sources, trackers
        """The I/O loop's sources and trackers by name, shared, not copied."""
        self._active = active
        """Shared with the I/O loop: source name -> last time it sent anything (for idle probes)."""
        self._guard = guard
        self._secure = secure
        """``secure(dealer, source)`` makes a DEALER a CURVE client of the source, when it has a key."""
        self.dealers: dict[str, zmq.Socket] = {}
        self.dealer_owner: dict[zmq.Socket, str] = {}
        self.inflight: dict[str, tuple[str, float]] = {}  # source -> (kind, deadline)
        self._deferred: dict[str, tuple[str, bytes, float]] = {}  # request held back by back-off
        self._streak: dict[str, tuple[int, float, float]] = {}  # requests in a row, last at, delay
        self._snapshots = SnapshotAnswers(config, guard)
        self._next_probe_check = 0.0
        self._counts: dict[str, tuple[zmq.Socket, ConnectionBytes]] = {}  # source -> its DEALER's monitor, count
        self._answered: dict[str, float] = {}  # source -> when its DEALER last delivered a whole message
        self._clock = CountClock()

    def tick(self) -> None:
        """Once per loop turn: send requests whose back-off ended, expire unanswered ones, probe idle sources."""
        self._send_deferred()
        self._expire_requests()
        self._probe_idle()
        self._count_answers()

    def poll_timeout_ms(self) -> int:
        """How long the loop may wait before a request is due or times out (at most 100 ms)."""
        if not self.inflight:
            return 100
        soonest = min(deadline for _, deadline in self.inflight.values())
        if self._deferred:
            soonest = min(soonest, min(at for _, _, at in self._deferred.values()))
        return max(0, min(100, int((soonest - time.monotonic()) * 1000) + 1))

    def forget(self, name: str) -> None:
        """Drop a removed source's requests and its DEALER."""
        self.inflight.pop(name, None)
        self._deferred.pop(name, None)
        self._streak.pop(name, None)
        self._answered.pop(name, None)
        self.close_dealer(name)

    def close(self) -> None:
        for name in list(self.dealers):
            self.close_dealer(name)
        self.inflight.clear()

    def request(self, name: str, kind: str, start_seq: int) -> None:
        body = SNAPSHOT_REQUEST if kind == SNAPSHOT else pack_seq(start_seq)
        if kind == SNAPSHOT:
            self._snapshots.start(name)
        delay = self._backoff(name)
        if delay > 0:
            send_at = time.monotonic() + delay
            self._deferred[name] = (kind, body, send_at)
            self.inflight[name] = (kind, send_at + self._timeout(kind))
            self._trackers[name].stats.backoffs += 1
            return
        self._deferred.pop(name, None)
        self._send_request(name, kind, body)

    def _backoff(self, name: str) -> float:
        """Seconds the next request of ``name`` waits (see the module doc)."""
        cfg = self._config
        now = time.monotonic()
        count, last, delay = self._streak.get(name, (0, 0.0, 0.0))
        if now - last >= cfg.recovery_quiet_s + 2 * delay:
            count = 0
        count += 1
        extra = count - cfg.recovery_free_requests
        delay = 0.0 if extra <= 0 else min(cfg.recovery_backoff_max_s, cfg.recovery_backoff_s * 2 ** (extra - 1))
        self._streak[name] = (count, now + delay, delay)
        return delay

    def _send_deferred(self) -> None:
        if not self._deferred:
            return
        now = time.monotonic()
        for name, (kind, body, send_at) in list(self._deferred.items()):
            if now >= send_at:
                del self._deferred[name]
                if name in self._sources and self.inflight.get(name, (None,))[0] == kind:
                    self._send_request(name, kind, body)

    def _send_request(self, name: str, kind: str, body: bytes) -> None:
        src = self._sources[name]
        dealer = self.dealers.get(name)
        try:
            if dealer is None:
                dealer = self._ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                # Bounded like the SUB sockets (SubscriberConfig.max_source_queue_bytes): a replay
                # beyond what we read in time waits in the publisher (or is cut and recovered).
                dealer.setsockopt(zmq.RCVHWM, self._config.queue_messages())
                dealer.setsockopt(zmq.MAXMSGSIZE, self._config.max_message_bytes)
                self._secure(dealer, src)
                monitor = dealer.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
                self._counts[name] = (monitor, ConnectionBytes())
                self.dealers[name] = dealer
                self.dealer_owner[dealer] = name
                self._poller.register(dealer, zmq.POLLIN)
                dealer.connect(parse_sub_endpoint(src.replay_endpoint).address)
            dealer.send_multipart((b"", body))
        except zmq.ZMQError as e:
            # Fail it through the normal timeout path on the next loop turn (no re-entry here).
            self._guard.warn_once(name, "replay endpoint unusable", f"{src.replay_endpoint}: {e}")
            self.inflight[name] = (kind, 0.0)
            return
        self.inflight[name] = (kind, time.monotonic() + self._timeout(kind))

    def _timeout(self, kind: str) -> float:
        return self._config.snapshot_timeout if kind == SNAPSHOT else self._config.replay_timeout

    def close_dealer(self, name: str) -> None:
        dealer = self.dealers.pop(name, None)
        counted = self._counts.pop(name, None)
        if dealer is not None:
            self.dealer_owner.pop(dealer, None)
            self._poller.unregister(dealer)
            if counted is not None:
                dealer.disable_monitor()
                counted[0].close(linger=0)
            dealer.close(linger=0)

    def _count_answers(self) -> None:
        """Give up a request whose answer holds more than ``max_connection_bytes`` unfinished (module doc)."""
        since = self._clock.due()
        if since is None or not self._counts:
            return
        limit = self._config.max_connection_bytes
        for name, (monitor, count) in list(self._counts.items()):
            while monitor.poll(0):
                event = recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_CONNECTED:
                    count.connected(event["value"])
                else:
                    count.disconnected()
            held = count.check(delivered=self._answered.get(name, 0.0) >= since)
            if held <= limit:
                continue
            kind = self.inflight.pop(name, (None, 0.0))[0]
            self._deferred.pop(name, None)
            self.close_dealer(name)
            self._clock.cut()
            why = f"{held >> 20} MiB received without a whole message (max_connection_bytes={limit >> 20} MiB)"
            self._guard.bad_frame(name, "rejected", "a replay answer that never ends", why)
            if kind is not None:
                self._trackers[name].on_request_failed(kind, f"its answer never ended: {why}")

    def _expire_requests(self) -> None:
        now = time.monotonic()
        for name, (kind, deadline) in list(self.inflight.items()):
            if now >= deadline:
                del self.inflight[name]
                self._deferred.pop(name, None)
                # A fresh DEALER, so a late answer to this request cannot be taken for the next one.
                self.close_dealer(name)
                self._guard.warn_once(name, f"{kind} timeout", f"no answer in {self._timeout(kind)}s")
                self._trackers[name].on_request_failed(kind, f"no {kind} answer in {self._timeout(kind)}s")

    def _probe_idle(self) -> None:
        interval = self._config.idle_probe_interval
        if interval is None:
            return
        now = time.monotonic()
        if now < self._next_probe_check:
            return
        self._next_probe_check = now + min(interval, 0.1)
        for name, tracker in self._trackers.items():
            if name not in self.inflight and now - self._active.get(name, 0.0) >= interval:
                self._active[name] = now
                tracker.probe()

    def on_dealer(self, name: str, dealer: zmq.Socket) -> None:
        tracker = self._trackers[name]
        for _ in range(MESSAGES_PER_TURN):
            if self.dealers.get(name) is not dealer:
                return  # closed by a timeout or failure below
            try:
                frames = dealer.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            self._answered[name] = time.monotonic()
            kind = self.inflight.get(name, (None, 0.0))[0]
            if kind is None or name in self._deferred:
                continue  # a stray answer to a request we gave up (or have not sent yet)
            self._active[name] = now = time.monotonic()
            self.inflight[name] = (kind, now + self._timeout(kind))
            body = frames[1:] if frames and frames[0] == b"" else frames
            if len(body) == 3 and body[0] == SNAPSHOT_TAG:
                if kind == SNAPSHOT:
                    self._on_snapshot_frame(name, tracker, body)
                else:  # snapshot frames answering a replay: bad; the replay times out as usual
                    self._guard.bad_frame(name, "decode_errors", "snapshot frames answering a replay", "")
            elif len(body) in (2, 3) and len(body[-2]) == 8:
                seq_frame, payload = body[-2], body[-1]
                if seq_frame == END_SEQ or not payload:
                    del self.inflight[name]
                    if kind == SNAPSHOT:
                        tracker.on_request_failed(SNAPSHOT, "the source does not serve snapshots", True)
                    else:
                        tracker.on_replay_end()
                elif kind == REPLAY:  # only the batch that continues the stream is worth decoding
                    seq = unpack_seq(seq_frame)
                    tracker.on_replay_batch(seq, self._guard.decode(name, payload) if tracker.wants(seq) else None)
            else:
                self._guard.bad_frame(name, "decode_errors", "bad replay frames",
                                f"{len(frames)} frames, seq frame of {len(body[-2]) if len(body) > 1 else 0} bytes")

    def _on_snapshot_frame(self, name: str, tracker: SourceTracker, body: list[bytes]) -> None:
        """Act on one frame of a snapshot answer (snapshot_answer.py says what it is)."""
        answer = self._snapshots.read(name, body)
        if isinstance(answer, SnapshotChunk):
            tracker.on_snapshot_chunk(answer.events)
            return
        del self.inflight[name]
        if isinstance(answer, SnapshotFailure):  # given up (the frame that broke it counted, unless it was)
            self.close_dealer(name)
            if answer.counter is not None:
                self._guard.bad_frame(name, answer.counter, answer.what, answer.detail)
            if tracker.mode == SNAPSHOT:
                tracker.on_request_failed(SNAPSHOT, answer.detail)
        elif answer.busy:  # ask again after a back-off (no loss)
            count, last, delay = self._streak.get(name, (0, 0.0, 0.0))
            self._streak[name] = (max(count, self._config.recovery_free_requests), time.monotonic(), delay)
            self.request(name, SNAPSHOT, 0)
        else:
            tracker.on_snapshot_end(answer.next_seq)
