"""Is a replica's KV event stream current? Stalled, lagging or lost -> degraded; caught up -> exact.

The index is only as good as the stream it folds. Besides bad frames (events/subscribe/frame_guard.py),
three failures make it wrong, each a cause of ``KVRouter.set_degraded`` (routing by load only):

- stalled: the replica's ``/load`` says its publisher sent batch N (``kv_events_seq``) and the
  router has not applied N ``max_lag_s`` after it first heard of it (the PUB connection is dead,
  the router's feed is stuck); or batches wait unsent in the replica's publisher longer than
  ``max_lag_s`` (``kv_events_unsent_s``: its I/O thread died); or the connection to its publisher
  has been down that long (the subscriber's socket monitor; what a vLLM replica shows of it).
  Batches published before the router applied any of the replica's (a router started or restarted
  after its replicas) are not owed: the first report's seq is the join point, and a source without
  replay endpoint never sends what came before again (the router's view is incomplete, not wrong).
- lagging: a live batch is applied more than ``max_lag_s`` after it was published (its ``ts``, on the
  replica's clock: the offset between the clocks is estimated from ``/load``'s ``timestamp``). Replayed
  batches are not passed here (``EventFeed.on_batch``): they were published before the router asked.
- lost: the subscriber gave a gap up (replay and snapshot could not fill it). The replica's tree
  is dropped at once and a snapshot resync asked for (``EventFeed.on_status``, router/control/event_feed.py).

Each cause clears by itself: stalled once the applied seq reaches the reported one; lagging on a
batch applied in time, or once nothing published is left to apply and no batch came late for
``max_lag_s`` (a stream late by a steady delay does not flap); lost once a snapshot is applied
(a source without snapshots: ``max_lag_s`` after the loss -- its tree, dropped at the loss, holds
only what the stream said since). An idle replica publishes nothing and reports the seq the router
applied: never degraded. A replica whose ``/load`` has no ``kv_events_seq`` (vLLM) is watched for
its connection, lag (clocks assumed in sync) and loss only.
"""

from __future__ import annotations

import logging
import time

from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.router.replicas.foreign_load import ForeignLoad
from kvmesh.router.replicas.replica import LAGGING, LOST_EVENTS, STALLED, DegradedCause, Replica
from kvmesh.router.replicas.stream import StreamState
from kvmesh.router.routing.kv_router import KVRouter

logger = logging.getLogger(__name__)


class StreamWatch:
    """Per-replica stream checks (see the module doc). ``on_batch``, ``on_lost`` and ``on_snapshot``
    run on the subscriber's thread, ``on_report`` and ``tick`` on the poller's."""

    def __init__(self, max_lag_s: float, router: KVRouter) -> None:
        """``router``: whose replicas' records hold their streams' state, and who degrades them."""
        self.max_lag_s = max_lag_s
        self._set = router.set_degraded
        self.replicas = router.replicas

    # ---------------------------------------------------------------- subscriber thread
    def on_batch(self, replica: Replica, batch_ts: float, now: float | None = None) -> None:
        """A batch was applied (``now``: the router's ``time.time()``)."""
        st = replica.stream
        now = time.time() if now is None else now
        lag = now + st.clock_offset - batch_ts
        if lag > self.max_lag_s:
            first, st.lagging, st.lagged_at = not st.lagging, True, now
            self._mark(replica, first, LAGGING,
                       f"event stream lagging: a batch applied {lag:.1f}s after it was published "
                       f"(events_max_lag_s={self.max_lag_s:g})")
        elif st.lagging:
            st.lagging = False
            self._clear(replica, LAGGING, "a batch applied in time")

    def on_lost(self, replica: Replica, detail: str, has_snapshots: bool, now: float | None = None) -> None:
        """The subscriber gave a gap of this replica up."""
        st = replica.stream
        first = st.lost_at is None
        st.lost_at = time.monotonic() if now is None else now
        st.lost_until_snapshot = has_snapshots
        then = ("resyncing from a snapshot" if has_snapshots else
                f"its cached blocks were forgotten and are relearned from new events for {self.max_lag_s:g}s")
        self._mark(replica, first, LOST_EVENTS, f"lost events ({detail}); {then}")

    def on_snapshot(self, replica: Replica) -> None:
        """A snapshot replaced everything the router knew of this replica."""
        st = replica.stream
        if st.lost_at is not None:
            st.lost_at = None
            self._clear(replica, LOST_EVENTS, "resynced from a snapshot")

    # ---------------------------------------------------------------- poller
    def on_report(self, replica: Replica, report: LoadReport | ForeignLoad, applied_seq: int, sent_at: float,
                  received_at: float, now: float | None = None) -> None:
        """A ``/load`` report, asked for at ``sent_at`` and answered at ``received_at`` (router's
        ``time.time()``); ``applied_seq``: the last seq of this replica the router applied, read
        after the answer arrived. ``now``: ``time.monotonic()``."""
        st = replica.stream
        now = time.monotonic() if now is None else now
        stamp: object
        published: object
        unsent_s: object
        if isinstance(report, LoadReport):
            stamp, published, unsent_s = report.timestamp, report.kv_events_seq, report.kv_events_unsent_s
        else:
            stamp, published = report.get("timestamp"), report.get("kv_events_seq")
            unsent_s = report.get("kv_events_unsent_s")
        if isinstance(stamp, int | float) and not isinstance(stamp, bool):
            st.clock_offset = float(stamp) - (sent_at + received_at) / 2
        if not isinstance(published, int) or isinstance(published, bool):
            return  # a replica that does not say (vLLM): lag and loss only
        why = None
        if applied_seq < 0:  # nothing applied yet: what was published before the router joined is not owed
            if st.joined_after is None:
                st.joined_after = published
            applied_seq = st.joined_after
        if applied_seq >= published:
            st.behind = None
            # A stream that is always late catches up after each late batch: stay degraded until
            # nothing late came for max_lag_s, so it does not flap between degraded and exact.
            if st.lagging and received_at - st.lagged_at > self.max_lag_s:
                st.lagging = False
                self._clear(replica, LAGGING, f"every published batch is applied, none late for "
                                                 f"{self.max_lag_s:g}s")
        else:
            if st.behind is None or applied_seq >= st.behind[0]:
                st.behind = (published, now)
            behind_s = now - st.behind[1]
            if behind_s > self.max_lag_s:
                why = (f"event stream stalled: {published - applied_seq} batches published but not applied "
                       f"for {behind_s:.0f}s")
        if isinstance(unsent_s, int | float) and unsent_s > self.max_lag_s:
            why = f"event stream stalled: the replica's publisher has not sent its batches of the last {unsent_s:.0f}s"
        self._stall(replica, st, "report", why)

    def tick(self, replica: Replica, disconnected_s: float | None = None, now: float | None = None) -> None:
        """Once per poll: ``disconnected_s``, how long the connection to the replica's publisher has
        been down (None: up, or not ours to tell); and a loss on a source without snapshots may
        have been outlived."""
        now = time.monotonic() if now is None else now
        if disconnected_s is not None and disconnected_s > self.max_lag_s:
            self._stall(replica, replica.stream, "link",
                        f"event stream stalled: no connection to its publisher for {disconnected_s:.0f}s")
        st = replica.stream
        if disconnected_s is None or disconnected_s <= self.max_lag_s:
            self._stall(replica, st, "link", None)
        if st.lost_at is not None and not st.lost_until_snapshot and now - st.lost_at > self.max_lag_s:
            st.lost_at = None
            self._clear(replica, LOST_EVENTS, f"no further loss for {self.max_lag_s:g}s")

    # ---------------------------------------------------------------- helpers
    def _stall(self, replica: Replica, st: StreamState, by: str, why: str | None) -> None:
        """What ``by`` shows of a stall: ``why``, or None (nothing); stalled while either shows one."""
        if why is None:
            if st.stalled_by.pop(by, None) is None or st.stalled_by:
                return
            st.stalled = False
            self._clear(replica, STALLED, "caught up")
            return
        st.stalled_by[by] = why
        first, st.stalled = not st.stalled, True
        self._mark(replica, first, STALLED, "; ".join(st.stalled_by.values()))

    def _mark(self, replica: Replica, first: bool, cause: DegradedCause, reason: str) -> None:
        if first:  # the reason is updated at every check, logged once
            logger.warning("replica %s: %s; routing to it by load only", replica.id, reason)
        self._set(replica, reason, cause)

    def _clear(self, replica: Replica, cause: DegradedCause, why: str) -> None:
        logger.info("replica %s: event stream exact again (%s)", replica.id, why)
        self._set(replica, None, cause)
