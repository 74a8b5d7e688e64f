"""Follows the KV event streams of many publishers (one per replica) and delivers them in order.

One background thread owns every socket: a SUB per publisher (or one bound SUB that many
publishers connect to, told apart by topic) and a DEALER per publisher for replay/snapshot
requests. Ordering and recovery are ``tracker.SourceTracker``'s; bad frames and degraded sources
``subscriber_guard``'s; this file moves frames. Should the I/O loop crash anyway (a bug), the
thread rebuilds it with the same sources after ``feed_restart_s`` -- ``feed_alive`` and
``feed_error`` say so meanwhile, for a ``/health`` endpoint.
Batches go to ``on_batch(source_name, seq, batch)`` on that thread, or, without a callback,
to ``async for source_name, seq, batch in subscriber``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
from kvmesh.events.schema import KVEventBatch
from kvmesh.events.stats import SourceStats
from kvmesh.events.subscriber_io import SubscriberIO

logger = logging.getLogger(__name__)


@dataclass
class PublisherSource:
    """One publisher to follow."""

    name: str
    """How batches of this publisher are labelled (e.g. the replica id)."""
    endpoint: str
    """Its PUB address: connect to it, or ``bind://tcp://host:port`` to listen for publishers
    that connect (several sources may share one bound address, told apart by ``topic``)."""
    replay_endpoint: str | None = None
    """Its replay/snapshot ROUTER address; None: no recovery (gaps are only counted)."""
    topic: str = ""
    """Topic prefix to subscribe to ("" = all)."""
    curve_server_key: str | None = None
    """The publisher's CURVE public key (Z85); None: ``SubscriberConfig.curve_server_key``."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("PublisherSource.name is empty; name the replica it follows")
        if "://" not in self.endpoint:
            raise ValueError(f"PublisherSource.endpoint {self.endpoint!r}: expected tcp://HOST:PORT")


@dataclass
class SubscriberConfig:
    """Timeouts and limits of an ``EventSubscriber``."""

    snapshot_on_start: bool = True
    """Ask each source with a replay endpoint for a snapshot when following starts (late join)."""
    replay_timeout: float = 2.0
    """Seconds without an answer before a replay request is given up (then: snapshot)."""
    snapshot_timeout: float = 5.0
    """Seconds without an answer before a snapshot request is given up (and counted)."""
    rcvhwm: int = 100_000
    """ZeroMQ receive high-water mark of each SUB socket (messages)."""
    max_pending: int = 100_000
    """Live batches held per source while a gap is being recovered."""
    idle_probe_interval: float | None = 1.0
    """Seconds a source may stay silent before we ask its replay socket for anything newer
    (finds batches lost at the tail of a burst); None disables probing."""
    reconnect_ivl_ms: int = 100
    """First reconnect delay after a publisher goes away."""
    reconnect_ivl_max_ms: int = 2000
    """Longest reconnect delay (exponential back-off up to this)."""
    max_payload_bytes: int = 64 << 20
    """Largest message accepted from a source (ZeroMQ drops bigger ones and the connection)."""
    max_batch_blocks: int = 65_536
    """Most blocks one batch (or snapshot chunk) may name; a bigger one is dropped as bad."""
    max_source_blocks: int = 1_000_000
    """Most blocks one source may hold: a snapshot beyond it is refused, and consumers (the
    router) drop batches that would take a source past it."""
    bad_frame_threshold: int = 20
    """Bad frames within ``bad_frame_window_s`` that degrade a source (load-only routing)."""
    bad_frame_window_s: float = 10.0
    """Sliding window of the bad-frame count, in seconds."""
    degraded_probation_s: float = 2.0
    """A degraded source is trusted again once a snapshot resync was applied and it then sent no
    bad frame for this long (without snapshots: ``bad_frame_window_s``)."""
    recovery_free_requests: int = 4
    """Replay/snapshot requests of one source in quick succession before back-off starts."""
    recovery_backoff_s: float = 0.05
    """First back-off delay of a repeated replay/snapshot request; doubles per further request."""
    recovery_backoff_max_s: float = 5.0
    """Longest back-off delay between two replay/snapshot requests of one source."""
    recovery_quiet_s: float = 0.5
    """A source that made no request for this long (plus twice its last delay) starts afresh."""
    feed_restart_s: float = 0.5
    """Pause before the I/O thread's loop is rebuilt after it crashed."""
    curve_server_key: str | None = None
    """CURVE public key (Z85) of the publishers (one per cluster); set -> every source without a
    key of its own is followed over CURVE (encrypted, authenticated). None: plain text."""
    curve_public_key: str | None = None
    """This subscriber's CURVE public key (Z85); None with a server key -> a fresh keypair."""
    curve_secret_key: str | None = field(default=None, repr=False)
    """SECRET: this subscriber's CURVE secret key (Z85), the pair of ``curve_public_key``."""

    def __post_init__(self) -> None:
        if (self.curve_public_key is None) != (self.curve_secret_key is None):
            raise ValueError("SubscriberConfig.curve_public_key and curve_secret_key go together (a keypair)")
        for name in ("replay_timeout", "snapshot_timeout", "rcvhwm", "max_pending", "reconnect_ivl_ms",
                     "max_payload_bytes", "max_batch_blocks", "max_source_blocks", "bad_frame_threshold",
                     "bad_frame_window_s", "recovery_backoff_s", "recovery_backoff_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SubscriberConfig.{name} must be positive, got {getattr(self, name)}")


BatchCallback = Callable[[str, int, KVEventBatch], None]
StatusCallback = Callable[[str, str, str], None]


class EventSubscriber:
    """Follows many publishers; see the module doc."""

    def __init__(
        self,
        sources: list[PublisherSource] | None = None,
        on_batch: BatchCallback | None = None,
        config: SubscriberConfig | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        self.config = config or SubscriberConfig()
        self._on_batch = on_batch
        self._on_status = on_status
        self._items: deque[tuple[str, int, KVEventBatch]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._ctx = zmq.Context.instance()
        self._io = SubscriberIO(self._ctx, self.config, self._deliver, self._status)
        for src in sources or []:
            self._io.add_source(src)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.feed_error: str | None = None
        """The last crash of the I/O loop (None: never crashed), for /health."""
        self.feed_restarts = 0
        """Times the I/O loop was rebuilt after a crash."""

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> EventSubscriber:
        """Start following (returns self)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvmesh-event-subscriber", daemon=True)
            self._thread.start()
        return self

    @property
    def feed_alive(self) -> bool:
        """True while the I/O thread runs its loop (False before start, after close, or while a
        crashed loop waits to be rebuilt)."""
        return self._thread is not None and self._thread.is_alive() and self._io.crash is None

    def _run(self) -> None:
        """The I/O thread: the loop, rebuilt with the same sources whenever it crashes."""
        while True:
            self._io.run()
            crash = self._io.crash
            if crash is None or self._closed:
                return
            self.feed_error = f"{type(crash).__name__}: {crash}"
            time.sleep(self.config.feed_restart_s)
            if self._closed:
                return
            self._io = self._rebuilt(self._io)
            self.feed_restarts += 1
            logger.warning("KV event feed restarted after a crash (%s)", self.feed_error)

    def _rebuilt(self, old: SubscriberIO) -> SubscriberIO:
        """A fresh I/O loop following ``old``'s sources, keeping their counters and pending calls."""
        new = SubscriberIO(self._ctx, self.config, self._deliver, self._status)
        for name, src in old._sources.items():
            try:
                new.add_source(src)
            except Exception as e:
                logger.error("KV event feed restart: source %s could not be re-added: %s", name, e)
                continue
            new.trackers[name].stats = old.trackers[name].stats
        new._calls.extend(old._calls)
        return new

    def close(self) -> None:
        """Stop the thread and close every socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._io.call(None)
            if threading.current_thread() is not self._thread:  # close() from on_batch: no join
                self._thread.join(timeout=5)
        else:
            self._io.close_sockets()
        self._wake_iterator()

    def __enter__(self) -> EventSubscriber:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- sources ----------------------------------------------------------------------------------
    def add_source(self, source: PublisherSource) -> None:
        """Follow one more publisher (thread-safe). A source of the same name is replaced,
        unless it is identical (then nothing changes)."""
        self._io.call(("add", source))

    def remove_source(self, name: str) -> None:
        """Stop following a publisher and drop its state (thread-safe)."""
        self._io.call(("remove", name))

    def bound_endpoint(self, name: str) -> str | None:
        """For a source with a ``bind://`` endpoint: the address publishers should connect to."""
        return self._io.bound.get(name)

    @property
    def stats(self) -> dict[str, SourceStats]:
        """Counters per source name (a live view; read without a lock)."""
        return {name: t.stats for name, t in list(self._io.trackers.items())}

    def totals(self) -> dict[str, int]:
        """Counters summed over every source (last_seq left out)."""
        out: dict[str, int] = {}
        for st in self.stats.values():
            for k, v in st.as_dict().items():
                if k != "last_seq":
                    out[k] = out.get(k, 0) + v
        return out

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Poll ``predicate`` until it holds or ``timeout`` seconds pass; True if it held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.005)
        return predicate()

    # -- delivery ---------------------------------------------------------------------------------
    def _deliver(self, name: str, seq: int, batch: KVEventBatch) -> None:
        if self._on_batch is not None:
            self._on_batch(name, seq, batch)
            return
        self._items.append((name, seq, batch))
        self._wake_iterator()

    def _status(self, name: str, status: str, detail: str) -> None:
        if self._on_status is not None:
            self._on_status(name, status, detail)

    def _wake_iterator(self) -> None:
        loop, ready = self._loop, self._ready
        if loop is not None and ready is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:
                pass  # the loop closed meanwhile

    def __aiter__(self) -> EventSubscriber:
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        return self

    async def __anext__(self) -> tuple[str, int, KVEventBatch]:
        while True:
            if self._items:
                return self._items.popleft()
            if self._closed:
                raise StopAsyncIteration
            assert self._ready is not None, "use `async for ... in subscriber`"
            self._ready.clear()
            if self._items:
                continue
            try:
                await asyncio.wait_for(self._ready.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
