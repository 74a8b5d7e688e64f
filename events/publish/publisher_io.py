"""The publisher's I/O thread: sends batches, keeps the replay ring and the shadow, answers requests.

Everything here runs on one thread, which owns the PUB (an XPUB), ROUTER and wake-up sockets; the
only state shared with the engine thread is the batch deque (append/popleft are atomic), the
``stats`` counters and ``subscribers`` (ints, read without a lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import zmq
from kvmesh.events.codec import encode_batch
from kvmesh.events.config import PublisherConfig
from kvmesh.events.publish.load_subscribers import LoadSubscribers
from kvmesh.events.ratelimit import TokenBucket
from kvmesh.events.schema import KVEvent, KVEventBatch
from kvmesh.events.state import CachedBlockSet
from kvmesh.events.wire import END_SEQ, LOAD_REQUEST, SNAPSHOT_REQUEST, SNAPSHOT_TAG, pack_seq, unpack_seq

logger = logging.getLogger(__name__)


def peer_address(frame: zmq.Frame) -> str:
    """The TCP source of a received frame ("" where the transport has none, e.g. ipc)."""
    try:
        address = frame.get("Peer-Address")
    except zmq.ZMQError:
        return ""
    return address if isinstance(address, str) else ""


_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)
# Replay/snapshot requests answered per loop turn, so a flood of requests cannot starve sends.
_REQUESTS_PER_TURN = 16


class PublisherIO:
    """State and loop of the publisher's I/O thread (see ``publisher.py`` for the picture)."""

    def __init__(
        self, pub: zmq.Socket, replay: zmq.Socket | None, wake: zmq.Socket, queue: deque[KVEventBatch],
        space: threading.Condition, topic: bytes, dp_rank: int, buffer_steps: int, buffer_max_bytes: int,
        snapshot_chunk_blocks: int, limits: PublisherConfig,
    ) -> None:
        self._pub, self._replay, self._wake = pub, replay, wake
        self._xpub = pub  # what the subscriptions are read from (tests wrap ``_pub``, the sender)
        self._queue, self._space = queue, space
        self._topic = topic
        self._dp_rank = dp_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._buffer_bytes = 0
        self._buffer_max_bytes = buffer_max_bytes
        self._chunk_blocks = snapshot_chunk_blocks
        self.shadow = CachedBlockSet()
        self.next_seq = 0
        self.stats = {"batches": 0, "events": 0, "replays": 0, "snapshots": 0, "resyncs": 0, "bad_requests": 0,
                      "throttled": 0}
        # Limits of the replay/snapshot socket (PublisherConfig.replay_* / snapshot*).
        self._requests = TokenBucket(limits.replay_requests_per_s, limits.replay_request_burst)
        self._snapshots = TokenBucket(limits.snapshots_per_s, limits.snapshot_burst)
        self._answer_bytes = TokenBucket(limits.replay_bytes_per_s, limits.replay_max_queued_bytes)
        self.subscribers = 0
        """Subscriptions covering ``topic`` from the peers connected now (the XPUB's reports)."""
        self.subscribed = threading.Condition()
        """Notified whenever ``subscribers`` changes."""
        self.loads = LoadSubscribers()
        """Routers that asked for the replica's load, and its latest update (events/load.py)."""
        self._stopping = False
        self.busy = False
        self._warned: set[str] = set()

    def stop(self) -> None:
        self._stopping = True

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake, zmq.POLLIN)
        poller.register(self._xpub, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while True:
                self._send_queued()
                if self._stopping:
                    break
                ready = dict(poller.poll(100))
                if self._wake in ready:
                    self._drain_wake()
                if self._xpub in ready:
                    self._read_subscriptions()
                if self._replay is not None and self._replay in ready:
                    self._serve_requests()
        except Exception:  # pragma: no cover - a bug here must not pass silently
            logger.exception("KV event publisher I/O thread crashed; no more events will be sent")
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close(linger=0)
            self._wake.close(linger=0)

    def _drain_wake(self) -> None:
        try:
            while True:
                self._wake.recv(zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _read_subscriptions(self) -> None:
        """Count the subscribe (``\\x01topic``) and unsubscribe (``\\x00topic``) reports that cover
        our topic; others (a peer's own topics) are read and forgotten, so they cost no memory."""
        change = 0
        for _ in range(_REQUESTS_PER_TURN):
            try:
                report = self._xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if report[:1] in (b"\x00", b"\x01") and self._topic.startswith(report[1:]):
                change += 1 if report[0] else -1
        if change:
            with self.subscribed:
                self.subscribers = max(0, self.subscribers + change)
                self.subscribed.notify_all()

    def _send_queued(self) -> None:
        queue = self._queue
        sent = False
        self.busy = True  # set before popping: see ZmqEventPublisher.flushed()
        while True:
            while queue:
                try:
                    batch = queue.popleft()
                except IndexError:
                    break
                self._send(batch)
                sent = True
            # publish() skips the wake-up while we are busy: clear the flag, then look once more.
            self.busy = False
            if not queue:
                break
            self.busy = True
        if sent:
            with self._space:
                self._space.notify_all()
        if self._replay is not None and self.loads.pending():
            self.loads.send_offered(self._replay)

    def _send(self, batch: KVEventBatch) -> None:
        seq = self.next_seq
        payload = encode_batch(batch)
        pub = self._pub
        try:  # three sends with int flags: send_multipart's enum arithmetic costs ~3x more
            pub.send(self._topic, _MORE)
            pub.send(pack_seq(seq), _MORE)
            pub.send(payload, _LAST)
        except zmq.Again:
            pass  # PUB at its high-water mark: the batch stays in the replay buffer
        self.next_seq = seq + 1
        self.shadow.apply_all(batch.events)
        self._remember(seq, payload)
        self.stats["batches"] += 1
        self.stats["events"] += len(batch.events)

    def _remember(self, seq: int, payload: bytes) -> None:
        buf = self._buffer
        if len(buf) == buf.maxlen:
            self._buffer_bytes -= len(buf[0][1])
        buf.append((seq, payload))
        self._buffer_bytes += len(payload)
        while self._buffer_bytes > self._buffer_max_bytes and len(buf) > 1:
            self._buffer_bytes -= len(buf.popleft()[1])

    def _serve_requests(self) -> None:
        for _ in range(_REQUESTS_PER_TURN):
            try:
                raw = self._replay.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = [frame.bytes for frame in raw]
            if len(frames) != 3 or frames[1] != b"":
                self._bad_request(f"expected [identity, b'', request], got {len(frames)} frames")
                continue
            identity, _, request = frames
            if request == LOAD_REQUEST:  # limited per peer address, not by the socket's budget (load_subscribers.py)
                if not self.loads.subscribe(self._replay, identity, peer_address(raw[-1])):
                    self.stats["throttled"] += 1
                continue
            snapshot = request == SNAPSHOT_REQUEST
            if not snapshot and len(request) != 8:
                self._bad_request(f"request frame of {len(request)} bytes is neither a seq nor a snapshot")
                self._replay.send_multipart((identity, b"", b"", END_SEQ, b""))
                continue
            if not self._admit(snapshot):
                if snapshot:  # only kvmesh subscribers ask for snapshots: tell them to come back later
                    self._replay.send_multipart((identity, b"", SNAPSHOT_TAG, END_SEQ, b""))
                continue
            if snapshot:
                sent = self._send_snapshot(identity)
            else:
                sent = self._send_replay(identity, unpack_seq(request))
            self._answer_bytes.spend(sent)

    def _admit(self, snapshot: bool) -> bool:
        """Within the socket's limits? Beyond them a replay request is dropped unanswered (a vLLM
        subscriber would read an early end marker as "nothing lost") and a snapshot request gets
        "busy"; the asker's back-off paces it, and a flood costs this process nothing more."""
        if (self._answer_bytes.available() and self._requests.take()
                and (not snapshot or self._snapshots.take())):
            return True
        self.stats["throttled"] += 1
        if "throttled" not in self._warned:
            self._warned.add("throttled")
            logger.warning("replay/snapshot requests beyond the socket's limits are dropped unanswered "
                           "(PublisherConfig.replay_requests_per_s, snapshots_per_s, replay_bytes_per_s)")
        return False

    def _bad_request(self, what: str) -> None:
        self.stats["bad_requests"] += 1
        if what not in self._warned:
            self._warned.add(what)
            logger.warning("ignoring a bad replay request: %s", what)

    def _send_replay(self, identity: bytes, start_seq: int) -> int:
        """vLLM's answer: every buffered batch with seq >= start_seq, then the end marker.
        Returns the bytes sent."""
        send = self._replay.send_multipart
        sent = 0
        for seq, payload in self._buffer:
            if seq >= start_seq:
                send((identity, b"", self._topic, pack_seq(seq), payload))
                sent += len(payload)
        send((identity, b"", b"", END_SEQ, b""))
        self.stats["replays"] += 1
        return sent

    def _send_snapshot(self, identity: bytes) -> int:
        """The shadow as BlockStored chains in chunks, tagged with the next seq (wire.py).
        Returns the bytes sent."""
        next_seq = pack_seq(self.next_seq)
        send = self._replay.send_multipart
        chunk: list[KVEvent] = []
        size = sent = 0
        ts = time.time()
        for event in self.shadow.iter_snapshot(self._chunk_blocks):  # streamed while built
            if size + len(event.block_hashes) > self._chunk_blocks and chunk:
                payload = self._encode_chunk(ts, chunk)
                send((identity, b"", SNAPSHOT_TAG, next_seq, payload))
                sent += len(payload)
                chunk, size = [], 0
            chunk.append(event)
            size += len(event.block_hashes)
        if chunk:
            payload = self._encode_chunk(ts, chunk)
            send((identity, b"", SNAPSHOT_TAG, next_seq, payload))
            sent += len(payload)
        send((identity, b"", SNAPSHOT_TAG, next_seq, b""))
        self.stats["snapshots"] += 1
        return sent

    def _encode_chunk(self, ts: float, events: list[KVEvent]) -> bytes:
        return encode_batch(KVEventBatch(ts=ts, events=events, data_parallel_rank=self._dp_rank))
