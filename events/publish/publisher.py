"""Publishes a replica's KV events on ZeroMQ, vLLM-compatible, with replay and snapshots.

::

    engine thread                      I/O thread (owns every socket)
    publish(events) ──deque──wake──▶   seq = next; encode; PUB send [topic, seq, payload]
                                       XPUB: subscribers joining/leaving -> ``subscribers``
       (never touches the network)     shadow.apply(events); ring buffer (seq, payload)
                                       ROUTER: replay request  -> buffered batches + end marker
                                               snapshot request -> shadow as BlockStored chains

Snapshots come from a *shadow* of the cache that the I/O thread folds from the very batches it
sends, not from calling the block pool. Why: (1) the I/O thread answers between two sends, so
the shadow is consistent with exactly the last sent seq, by construction, with no lock against
the engine thread that mutates the pool; (2) snapshots are answered while the engine is idle
(an engine-thread design would wait for the next step); (3) the shadow equals the fold of the
stream, which is precisely the state a subscriber that saw every batch holds. The cost is one
dict entry per cached block (token ids are shared with the sent events, not copied) and ~0.3 us
of I/O-thread CPU per event; sending a snapshot pauses sends while it is built and encoded
(~0.1-0.2 s per 100k blocks), and the batches queued meanwhile follow it in order.

``snapshot_source`` (the block pool's ``snapshot_events``) is called on the *caller's* thread
only: at construction, to announce a non-empty starting cache as batch 0
(``[AllBlocksCleared, *chains]``), and when the send queue overflows, to replace every queued
batch by one such resync batch -- so memory stays bounded and the stream stays exact. Without
a source, an overflowing ``publish`` waits for the I/O thread (CPU back-pressure, never network:
the PUB socket drops at its high-water mark rather than block).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import zmq
from kvmesh.events import curve
from kvmesh.events.config import PublisherConfig
from kvmesh.events.endpoints import attach, offset_port, parse_listen_endpoint, parse_pub_endpoint
from kvmesh.events.load import ReplicaLoadUpdate, encode_load_update
from kvmesh.events.publish.publisher_io import PublisherIO
from kvmesh.events.schema import AllBlocksCleared, BlockStored, KVEvent, KVEventBatch
from kvmesh.events.wire import MAX_REQUEST_BYTES

__all__ = ["PublisherConfig", "ZmqEventPublisher"]

logger = logging.getLogger(__name__)


class ZmqEventPublisher:
    """Non-blocking KV event publisher (one per replica / data-parallel rank)."""

    def __init__(
        self,
        config: PublisherConfig | None = None,
        snapshot_source: Callable[[], list[BlockStored]] | None = None,
        data_parallel_rank: int = 0,
    ) -> None:
        self.config = config = config or PublisherConfig()
        self.curve_public_key = curve.public_key(config.curve_secret_key) if config.curve_secret_key else None
        """The CURVE public key subscribers need (None: plain stream)."""
        self._snapshot_source = snapshot_source
        self._dp_rank = data_parallel_rank
        # An allow-list needs a ZAP handler, which is per context: this publisher gets its own.
        self._own_ctx = zmq.Context() if config.curve_client_keys else None
        ctx = self._own_ctx or zmq.Context.instance()
        self._auth = curve.start_authenticator(ctx, config.curve_client_keys) if self._own_ctx else None
        pub, self.endpoint = _bind_pub(ctx, config, data_parallel_rank)
        """The PUB address, port resolved (for a connect: the address connected to)."""
        replay, self.replay_endpoint = _bind_replay(ctx, config, data_parallel_rank, pub)
        """The bound replay/snapshot ROUTER address, port resolved; None when disabled."""
        self._replay_disabled = replay is None
        wake_recv, self._wake = _wake_pair(ctx, f"inproc://kvmesh-publisher-wake-{id(self)}-{time.monotonic_ns()}")
        self._wake_lock = threading.Lock()
        self._queue: deque[KVEventBatch] = deque()
        self._space = threading.Condition()
        self._io = PublisherIO(
            pub, replay, wake_recv, self._queue, self._space, config.topic.encode(), data_parallel_rank,
            config.buffer_steps, config.buffer_max_bytes, config.snapshot_chunk_blocks, config,
        )
        self._closed = False
        self._thread = threading.Thread(target=self._io.run, name="kvmesh-event-publisher", daemon=True)
        self._thread.start()
        if snapshot_source is not None:
            initial = snapshot_source()
            if initial:
                self.publish([AllBlocksCleared(), *initial])

    @property
    def subscribers(self) -> int:
        """Subscriptions that cover this publisher's topic, from the peers connected now (ZeroMQ's
        slow joiner: a batch sent before a subscriber's subscription arrived is not sent to it)."""
        return self._io.subscribers

    def wait_for_subscribers(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Wait until ``subscribers`` >= ``count`` (True) or ``timeout`` seconds passed (False)."""
        with self._io.subscribed:
            return self._io.subscribed.wait_for(lambda: self._io.subscribers >= count, timeout)

    @property
    def seq(self) -> int:
        """The seq the next sent batch will carry (= batches sent so far)."""
        return self._io.next_seq

    def unsent_s(self) -> float:
        """Seconds the oldest batch handed to ``publish`` has waited unsent (0.0: none waits).
        Grows without bound when the I/O thread died or is stuck: routers read it in ``/load``."""
        try:
            oldest = self._queue[0]
        except IndexError:
            return 0.0
        return max(0.0, time.time() - oldest.ts)

    def flushed(self) -> bool:
        """True when every batch handed to ``publish`` so far has been sent (and buffered)."""
        return not self._queue and not self._io.busy

    @property
    def stats(self) -> dict[str, int]:
        """Counters: batches, events, replays, snapshots, resyncs, bad_requests, throttled."""
        return dict(self._io.stats)

    def publish(self, events: list[KVEvent] | KVEventBatch) -> None:
        """Queue one engine step's events; returns at once. Empty batches are not sent."""
        if self._closed:
            raise RuntimeError("publish() on a closed ZmqEventPublisher; create a new one")
        if isinstance(events, KVEventBatch):
            batch = events
            if batch.data_parallel_rank is None:
                batch.data_parallel_rank = self._dp_rank
        else:
            batch = KVEventBatch(ts=time.time(), events=list(events), data_parallel_rank=self._dp_rank)
        if not batch.events:
            return
        if len(self._queue) >= self.config.max_queue_size:
            self._overflow(batch)
        else:
            self._queue.append(batch)
        if not self._io.busy:  # a busy I/O thread re-checks the queue before it sleeps
            self._kick()

    def publish_load(self, update: ReplicaLoadUpdate) -> None:
        """Send the replica's load to the routers that asked for it (events/load.py); returns at once. Needs the
        replay socket (without one there is nowhere to ask)."""
        if self._closed or self._replay_disabled:
            return
        self._io.loads.offer(update.seq, encode_load_update(update))
        if not self._io.busy:
            self._kick()

    @property
    def load_subscribers(self) -> int:
        """Routers whose request for the replica's load is recent enough that they get its updates."""
        return self._io.loads.count

    def _overflow(self, batch: KVEventBatch) -> None:
        if self._snapshot_source is not None:
            # The pool already reflects ``batch``: one resync batch replaces everything queued.
            resync = KVEventBatch(
                ts=time.time(), events=[AllBlocksCleared(), *self._snapshot_source()],
                data_parallel_rank=self._dp_rank,
            )
            self._queue.clear()
            self._queue.append(resync)
            self._io.stats["resyncs"] += 1
            logger.warning("event queue full (%d batches): replaced by one resync batch", self.config.max_queue_size)
            return
        with self._space:
            while len(self._queue) >= self.config.max_queue_size and self._thread.is_alive():
                self._kick()
                self._space.wait(0.05)
        self._queue.append(batch)

    def _kick(self) -> None:
        with self._wake_lock:
            if self._wake is not None:
                try:
                    self._wake.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a wake-up is already pending

    def close(self) -> None:
        """Send what is queued (up to ``shutdown_timeout``), then close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.config.shutdown_timeout
        while self._queue and time.monotonic() < deadline and self._thread.is_alive():
            self._kick()
            time.sleep(0.005)
        if self._queue:
            logger.warning("closing event publisher with %d unsent batches", len(self._queue))
        self._io.stop()
        self._kick()
        self._thread.join(timeout=max(self.config.shutdown_timeout, 0.5))
        with self._wake_lock:
            self._wake.close(linger=0)
            self._wake = None
        if self._auth is not None:
            self._auth.stop()
        if self._own_ctx is not None:
            self._own_ctx.destroy(linger=0)

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _bind_pub(ctx: zmq.Context, config: PublisherConfig, rank: int) -> tuple[zmq.Socket, str]:
    """The socket the batches go out on, and its address (port resolved)."""
    # An XPUB is a PUB that also tells us who subscribes (the same to SUB peers on the wire):
    # ``subscribers`` counts them, so "has anyone joined yet" is a condition, not a guess.
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscribe and unsubscribe, not only the first/last
    pub.setsockopt(zmq.SNDHWM, config.hwm)
    pub.setsockopt(zmq.LINGER, int(config.shutdown_timeout * 1000))
    if config.curve_secret_key is not None:
        curve.make_server(pub, config.curve_secret_key)
    pub_ep = parse_pub_endpoint(offset_port(config.endpoint, rank))
    endpoint = attach(pub, pub_ep)
    if config.curve_secret_key is None and pub_ep.bind:
        curve.warn_if_plain_beyond_loopback(endpoint, "PUB socket")
    return pub, endpoint


def _bind_replay(ctx: zmq.Context, config: PublisherConfig, rank: int,
                 pub: zmq.Socket) -> tuple[zmq.Socket | None, str | None]:
    """The ROUTER answering replay and snapshot requests, and its address; (None, None) when disabled. A failed
    bind closes it and ``pub``."""
    if config.replay_endpoint is None:
        return None, None
    replay = ctx.socket(zmq.ROUTER)
    if config.curve_secret_key is not None:
        curve.make_server(replay, config.curve_secret_key)
    # Room for a whole replay (and a snapshot's chunks), whatever the PUB's hwm: a ROUTER
    # drops what exceeds its hwm, which would punch holes into answers.
    replay.setsockopt(zmq.SNDHWM, 2 * config.buffer_steps + 1024)
    # Requests are a few bytes: a peer sending big frames is dropped before they are held,
    # so a request flood can queue at most RCVHWM (1000) small messages per peer.
    replay.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
    replay.setsockopt(zmq.LINGER, 0)
    ep = parse_listen_endpoint(offset_port(config.replay_endpoint, rank))
    try:
        endpoint = attach(replay, ep)
    except zmq.ZMQError:
        pub.close(linger=0)
        replay.close(linger=0)
        raise
    if config.curve_secret_key is None:
        curve.warn_if_plain_beyond_loopback(endpoint, "replay/snapshot socket")
    return replay, endpoint


def _wake_pair(ctx: zmq.Context, addr: str) -> tuple[zmq.Socket, zmq.Socket]:
    """An inproc PULL the I/O thread polls and the PUSH that wakes it (at most one wake-up queued)."""
    wake_recv = ctx.socket(zmq.PULL)
    wake_recv.bind(addr)
    wake = ctx.socket(zmq.PUSH)
    wake.setsockopt(zmq.SNDHWM, 1)
    wake.setsockopt(zmq.LINGER, 0)
    wake.connect(addr)
    return wake_recv, wake
