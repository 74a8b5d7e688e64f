"""Follows the KV event streams of many publishers (one per replica) and delivers them in order.

One background thread owns every socket: a SUB per publisher (or one bound SUB that many
publishers connect to, told apart by topic) and a DEALER per publisher for replay/snapshot
requests, looped over by ``feed_loop.FeedLoop``. Ordering and recovery are ``tracker.SourceTracker``'s;
bad frames and degraded sources ``frame_guard.FrameGuard``'s. Should the I/O loop crash anyway (a bug),
the thread rebuilds it with the same sources after ``feed_restart_s`` -- ``feed_alive`` and
``feed_error`` say so meanwhile, for a ``/health`` endpoint.
Batches go to ``on_batch(source_name, seq, batch)`` on that thread, or, without a callback,
to ``async for source_name, seq, batch in subscriber``.
Statuses go to ``on_status(source_name, status, detail)`` on that thread (health.py names them):
"degraded" and "recovered" (bad frames, frame_guard.py), "snapshot_applied", "snapshot_failed" and
"unrecovered" (a loss neither replay nor snapshot repaired; tracker.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import zmq
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.schema import KVEventBatch
from kvmesh.events.subscribe.consumer import BatchCallback, StatusCallback
from kvmesh.events.subscribe.feed_loop import FeedLoop
from kvmesh.events.subscribe.stats import SourceStats
from kvmesh.events.subscribe.tracker import REPLAY

__all__ = ["EventSubscriber", "PublisherSource", "SubscriberConfig"]

logger = logging.getLogger(__name__)


def wait_until(predicate: Callable[[], bool], timeout: float, interval_s: float = 0.005) -> bool:
    """Poll ``predicate`` every ``interval_s`` until it holds or ``timeout`` seconds pass; True if it held
    (for an effect of the I/O thread that has no event of its own: a counter, a mode)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


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
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._io = FeedLoop(self._ctx, self.config, self._deliver, self._status)
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

    def _rebuilt(self, old: FeedLoop) -> FeedLoop:
        """A fresh I/O loop following ``old``'s sources, keeping their counters and pending calls."""
        new = FeedLoop(self._ctx, self.config, self._deliver, self._status)
        for name, src in old._sources.items():
            try:
                new.add_source(src)
            except Exception as e:
                logger.error("KV event feed restart: source %s could not be re-added: %s", name, e)
                continue
            new.trackers[name].stats = old.trackers[name].stats
            if name in old.guard.health:  # a degraded source stays degraded until its resync
                new.guard.health[name] = old.guard.health[name]
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

    def resync(self, name: str) -> None:
        """Replace what ``name`` delivered so far by a snapshot (thread-safe; nothing for a source
        without snapshots, see ``snapshots_supported``)."""
        self._io.call(("resync", name))

    def snapshots_supported(self, name: str) -> bool | None:
        """Whether ``name`` answers snapshot requests (None: not known yet, or no such source)."""
        tracker = self._io.trackers.get(name)
        return tracker.snapshot_supported if tracker is not None else None

    def replayed(self, name: str) -> bool:
        """Asked from ``on_batch``: whether the batch of ``name`` being delivered was replayed (published earlier and
        sent again to fill a gap or a late join): its ``ts`` says when it was published, not how late the stream is."""
        tracker = self._io.trackers.get(name)
        return tracker is not None and tracker.delivering == REPLAY

    def disconnected_s(self, name: str) -> float | None:
        """Seconds the connection to ``name``'s publisher has been down (or not yet up); None while
        it is up, for a source on a bound address (publishers connect to us) and for no such source."""
        feed = self._io._feed_of.get(name)
        since = feed.down_since if feed is not None else None
        return None if since is None else time.monotonic() - since

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
        return wait_until(predicate, timeout)

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
