"""The subscriber's defences: every frame decoded, checked and applied under guard.

``FeedLoop`` holds one ``FrameGuard`` (same thread). A frame that cannot be read, is shaped unlike a
batch (its msgpack headers are read before anything is decoded, peek.py), breaks a limit
(``SubscriberConfig.max_*``) or makes the consumer's ``on_batch`` raise is dropped and counted in
its source's ``SourceStats`` (``bad_frames`` and one of ``decode_errors`` / ``rejected`` /
``apply_errors``); the I/O thread and every other source carry on. A source that keeps sending
bad frames is degraded (``health.py``): the consumer hears ``on_status(name, "degraded", why)``,
the source is resynced from a snapshot, and ``on_status(name, "recovered", ...)`` follows once
the snapshot is applied and ``degraded_probation_s`` passed without a bad frame (or, without
snapshots, after a clean window).

Every source's decoding and applying is charged to it (``spend``): over ``source_busy_share`` seconds
per second, its socket is left unread until it paid its debt (``busy_wait_s``; feed_loop.py), so a
source whose batches are costly cannot take the I/O thread from the others.

A degraded source's live messages are decoded only within a budget (``admit``): a token bucket of
``degraded_source_bytes_per_s`` payload bytes per second, which is also its largest message. A
message beyond it is dropped unread and counted as bad, so a flooding source stays degraded and
what it costs the process (GIL time, decoded memory) is bounded by that budget. (``FeedLoop``
then stops reading the source's socket for a while: the flood waits in, and is dropped by, the
publisher's own queue.)
"""

from __future__ import annotations

import logging
import time

from kvmesh.events.codec import DecodeError, check_batch, decode_batch_counted
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.peek import ShapeError, peek_batch
from kvmesh.events.ratelimit import TokenBucket
from kvmesh.events.schema import KVEventBatch
from kvmesh.events.subscribe.consumer import BatchCallback, StatusCallback
from kvmesh.events.subscribe.health import DEGRADED, RECOVERED, SNAPSHOT_APPLIED, SourceHealth
from kvmesh.events.subscribe.tracker import SourceTracker

logger = logging.getLogger(__name__)

_HEALTH_CHECK_S = 0.1


class FrameGuard:
    """Decoding, limits, consumer errors and source health for ``FeedLoop``'s sources."""

    def __init__(self, config: SubscriberConfig, trackers: dict[str, SourceTracker], deliver: BatchCallback,
                 status: StatusCallback) -> None:
        self._config = config
        self._trackers = trackers
        """The I/O loop's trackers (source name -> SourceTracker), shared, not copied."""
        self._deliver_cb, self._status_cb = deliver, status
        self.health: dict[str, SourceHealth] = {}
        """Source name -> SourceHealth, created at the source's first bad frame."""
        self._warned: set[tuple[str, str]] = set()
        self._next_health_check = 0.0
        self._budgets: dict[str, TokenBucket] = {}
        """Source name -> its decode budget while degraded (see the module doc)."""
        self._busy: dict[str, TokenBucket] = {}
        """Source name -> seconds of the I/O thread it may still spend (``source_busy_share``)."""

    def forget(self, name: str) -> None:
        """Drop what is known about a removed source."""
        self.health.pop(name, None)
        self._budgets.pop(name, None)
        self._busy.pop(name, None)

    def spend(self, name: str, seconds: float) -> None:
        """Charge ``name`` for ``seconds`` of the I/O thread (decoding and applying its message)."""
        bucket = self._busy.get(name)
        if bucket is None:
            share = self._config.source_busy_share
            bucket = self._busy[name] = TokenBucket(share, share)
        bucket.spend(seconds)

    def busy_wait_s(self, name: str) -> float:
        """Seconds until ``name`` is back within its share of the I/O thread (0.0: it is)."""
        bucket = self._busy.get(name)
        return 0.0 if bucket is None else bucket.wait_s(0.0)

    def admit(self, name: str, payload_bytes: int) -> bool:
        """Whether a live payload of ``payload_bytes`` from ``name`` may be decoded (always, unless the
        source is degraded and over its budget: then it was dropped unread and counted)."""
        health = self.health.get(name)
        if health is None or not health.degraded:
            return True
        rate = self._config.degraded_source_bytes_per_s
        budget = self._budgets.get(name)
        if budget is None:
            budget = self._budgets[name] = TokenBucket(rate, rate)
        if budget.take(payload_bytes):
            return True
        self._trackers[name].stats.over_budget += 1
        self.bad_frame(name, "rejected", "over its decode budget while degraded",
                       f"{payload_bytes} bytes; degraded_source_bytes_per_s={rate}")
        return False

    def refused_for_s(self, name: str, payload_bytes: int) -> float:
        """Seconds until a refused payload of ``payload_bytes`` would fit ``name``'s budget (inf: never)."""
        budget = self._budgets.get(name)
        return 0.0 if budget is None else budget.wait_s(payload_bytes)

    def health_of(self, name: str) -> SourceHealth:
        health = self.health.get(name)
        if health is None:
            cfg = self._config
            health = self.health[name] = SourceHealth(cfg.bad_frame_threshold, cfg.bad_frame_window_s,
                                                      cfg.degraded_probation_s)
        return health

    def bad_frame(self, name: str, counter: str, what: str, detail: str) -> None:
        """Drop one bad message of ``name``: count it, warn once, degrade the source if it persists."""
        tracker = self._trackers.get(name)
        if tracker is None:
            return
        st = tracker.stats
        setattr(st, counter, getattr(st, counter) + 1)
        st.bad_frames += 1
        self.warn_once(name, what, detail)
        health = self.health_of(name)
        if health.record_bad(time.monotonic(), what):
            st.degradations += 1
            logger.warning("KV events from %s: source degraded (%s); resyncing it", name, health.reason)
            self._status_cb(name, DEGRADED, health.reason)
            tracker.resync()

    def decode(self, name: str, payload: bytes) -> KVEventBatch | None:
        """The checked batch of ``payload``, or None (counted) when it is bad."""
        tracker = self._trackers[name]
        if len(payload) > self._config.max_payload_bytes:
            self.bad_frame(name, "rejected", "payload too large",
                            f"{len(payload)} bytes; max_payload_bytes={self._config.max_payload_bytes}")
            return None
        cfg = self._config
        try:  # headers first: a payload that would be expensive to decode is refused unread
            peek_batch(payload, cfg.max_batch_events, cfg.max_batch_blocks)
        except ShapeError as e:
            tracker.stats.shape_refusals += 1
            self.bad_frame(name, "decode_errors", "payload refused by its shape", str(e))
            return None
        try:
            decoded = decode_batch_counted(payload, cfg.max_batch_events, cfg.max_batch_blocks)
            check_batch(decoded.batch, cfg.max_batch_blocks)
        except DecodeError as e:
            self.bad_frame(name, "decode_errors", "undecodable payload", str(e))
            return None
        if decoded.unknown_events:
            tracker.stats.unknown_events += decoded.unknown_events
            self.warn_once(name, "unknown events", f"{decoded.unknown_events} dropped")
        return decoded.batch

    def deliver(self, name: str, seq: int, batch: KVEventBatch) -> None:
        try:
            self._deliver_cb(name, seq, batch)
        except Exception as e:  # the consumer refused it (e.g. over a limit): drop it, carry on
            self.bad_frame(name, "apply_errors", "on_batch raised", f"{type(e).__name__}: {str(e)[:200]}")

    def tracker_status(self, name: str, status: str, detail: str) -> None:
        """Statuses from a tracker, passed on; a snapshot applied to a degraded source starts its probation."""
        if status == SNAPSHOT_APPLIED:
            health = self.health.get(name)
            if health is not None and health.degraded:
                health.resynced = True
        self._status_cb(name, status, detail)

    def check_health(self) -> None:
        """Trust degraded sources again once they qualify (``SourceHealth.may_recover``)."""
        now = time.monotonic()
        if now < self._next_health_check:
            return
        self._next_health_check = now + _HEALTH_CHECK_S
        for name, health in list(self.health.items()):
            tracker = self._trackers.get(name)
            if tracker is not None and health.may_recover(now, tracker.snapshot_supported is not False):
                why = "resynced from a snapshot" if health.resynced else "no bad frame for a whole window"
                health.recover()
                logger.info("KV events from %s: trusted again (%s)", name, why)
                self._status_cb(name, RECOVERED, why)

    def warn_once(self, name: str, what: str, detail: str) -> None:
        if (name, what) not in self._warned:
            self._warned.add((name, what))
            logger.warning("KV events from %s: %s (%s); further ones are only counted", name, what, detail)
