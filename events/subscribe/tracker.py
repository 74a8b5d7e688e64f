"""Per-publisher ordering and recovery: the subscriber's logic, without sockets.

A ``SourceTracker`` sees live batches (``on_live``), replay and snapshot answers, and request
failures; it delivers batches in seq order and asks its owner for replays and snapshots::

    LIVE ──gap (seq > last+1)──▶ REPLAY(last+1) ──covered──▶ LIVE (pending drained)
      │                             │ hole / timeout / no progress
      │                             ▼
      ├──start (late joiner)──▶ SNAPSHOT ──answer──▶ deliver [AllBlocksCleared, *chains]; LIVE
      │                             │ unsupported (vLLM) / timeout
      │                             ▼
      │                         give up: count, tell the consumer, resume from what arrives (give_up.py)
      └──seq drop──▶ restart: the next delivered batch starts with AllBlocksCleared (unless a replay or
                     snapshot just delivered that seq: the socket's late copy, dropped; late_copies.py)

A late joiner of a source without replay endpoint (vLLM publishes without one by default) takes the
first batch it sees as its baseline: what was published before it listened is unknown, not lost.

While recovering, live batches wait in ``pending`` (bounded in batches and payload bytes,
pending.py); once recovered they are delivered, skipping what the replay or snapshot already covered.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kvmesh.events.schema import AllBlocksCleared, BlockStored, KVEventBatch
from kvmesh.events.subscribe.consumer import BatchCallback, StatusCallback
from kvmesh.events.subscribe.give_up import LIVE, REPLAY, SNAPSHOT, GivingUp
from kvmesh.events.subscribe.health import SNAPSHOT_APPLIED
from kvmesh.events.subscribe.late_copies import LateCopies
from kvmesh.events.subscribe.pending import PendingBatches
from kvmesh.events.subscribe.source_log import SourceLog
from kvmesh.events.subscribe.stats import SourceStats


class SourceTracker(GivingUp):
    """Orders one publisher's batches and drives gap recovery (see the module picture)."""

    def __init__(self, name: str, deliver: BatchCallback, request: Callable[[str, str, int], None],
                 notify: StatusCallback, has_replay: bool, max_pending: int = 100_000,
                 max_pending_bytes: int = 32 << 20) -> None:
        self.name = name
        self._deliver, self._request, self._notify = deliver, request, notify
        self.has_replay = has_replay
        self.snapshot_supported: bool | None = None if has_replay else False
        self.stats = SourceStats()
        self.mode = LIVE
        self.last: int | None = None  # seq of the last delivered batch; None = no baseline yet
        self.pending = PendingBatches(max_pending, max_pending_bytes)
        self._clear_next = False  # prepend AllBlocksCleared to the next delivery (after a restart)
        self._replay_hole = False
        self._replay_from = 0
        self._snapshot_events: list[BlockStored] = []
        self._joining = False
        self._probing = False
        self._resync_after = False  # a reconnect happened during a replay: snapshot after it
        self._snapshot_failed = False  # within the current recovery
        self.log = SourceLog(name)
        self._accept_next = False  # after giving up: take the next batch as the new baseline
        self.late_copies = LateCopies()  # live batches a recovery delivered, arriving after it (late_copies.py)
        self.delivering = LIVE
        """How the batch being delivered reached us: LIVE, REPLAY (published earlier: its ``ts`` is old) or SNAPSHOT."""

    def start(self, snapshot_on_start: bool) -> None:
        """A late joiner asks for a snapshot first (if the source may have one)."""
        if snapshot_on_start and self.has_replay:
            self._joining = True
            self._begin(SNAPSHOT)

    # -- live stream ----------------------------------------------------------------------------
    def on_live(self, seq: int, batch: KVEventBatch, payload_bytes: int = 0) -> None:
        """One live batch (``payload_bytes``: its size on the wire, for the pending queue's byte cap)."""
        if self.mode != LIVE:
            self._hold(seq, batch, payload_bytes)
            return
        last = self.last
        if last is None:  # no baseline yet
            if seq != 0 and not self._accept_next and self.has_replay:
                self.last = last = -1  # missed the start of the stream: recover it
            else:
                if seq != 0 and not self._accept_next:
                    self._joined_late(seq)
                self._accept_next = False
                self._emit(seq, batch)
                return
        if seq == last + 1:
            self._emit(seq, batch)
        elif seq <= last:
            if self.late_copies.covers(seq):
                self.stats.covered_late += 1
                return
            self.stats.restarts += 1
            self.log.restarted(seq, last)
            self._clear_next = True
            self.last = -1
            if seq == 0:
                self._emit(seq, batch)
            else:
                self._gap(seq, batch, payload_bytes)
        else:
            self._gap(seq, batch, payload_bytes)

    def _joined_late(self, seq: int) -> None:
        """Joined a stream under way that cannot be replayed: its first batch seen is the baseline.
        What came before was said before this subscriber listened -- unknown, not lost: a consumer
        that starts (or restarts) here starts from an empty view of the source, which is the truth
        minus what it was never told. No loss is reported and nothing is degraded."""
        self.stats.late_joins += 1
        self.log.joined_late(seq)

    def _gap(self, seq: int, batch: KVEventBatch, payload_bytes: int) -> None:
        self.stats.gaps += 1
        self._hold(seq, batch, payload_bytes)
        self._begin(REPLAY if self.has_replay else None)

    def _hold(self, seq: int, batch: KVEventBatch, payload_bytes: int) -> None:
        self.stats.pending_overflows += self.pending.append(seq, batch, payload_bytes)

    # -- recovery -------------------------------------------------------------------------------
    def _begin(self, kind: str | None) -> None:
        if kind == SNAPSHOT and self.snapshot_supported is False:
            kind = None
        if kind is None:
            self._gave_up("the lost batches cannot be replayed or snapshotted")
            return
        self.mode = kind
        if kind == REPLAY:
            self._replay_hole = False
            self._replay_from = self.last + 1
            self._request(self.name, REPLAY, self._replay_from)
        else:
            self._snapshot_events = []
            self._request(self.name, SNAPSHOT, 0)

    def on_replay_batch(self, seq: int, batch: KVEventBatch | None) -> None:
        """One replayed batch (None when its payload could not be decoded)."""
        if self.mode != REPLAY or self._replay_hole or seq <= self.last:
            return
        if seq != self.last + 1 or batch is None:
            self._replay_hole = True  # the ring buffer no longer holds what we miss
            return
        self._emit(seq, batch, REPLAY)

    def wants(self, seq: int) -> bool:
        """Whether a replayed batch ``seq`` would be delivered (others need not be decoded)."""
        return self.mode == REPLAY and not self._replay_hole and self.last is not None and seq == self.last + 1

    def on_replay_end(self) -> None:
        if self.mode != REPLAY:
            return
        progressed = self.last >= self._replay_from
        was_probe, self._probing = self._probing, False
        if progressed or not was_probe:
            self.stats.replays += 1
        first_pending = self.pending.first_seq()
        still_gap = first_pending is not None and first_pending > self.last + 1
        if still_gap and not progressed and was_probe and not self._replay_hole:
            self.stats.gaps += 1  # the gap opened after the probe was answered: replay it
            self._begin(REPLAY)
            return
        if self._replay_hole or (still_gap and not progressed):
            self._begin(SNAPSHOT)
            return
        self.mode = LIVE
        self.late_copies.recovered(self.last)
        self._drain()
        if self._resync_after and self.mode == LIVE:
            self._resync_after = False
            self._begin(SNAPSHOT)

    def probe(self) -> None:
        """Ask for anything after the last delivered batch. Catches batches lost at the tail of a
        burst (a gap shows only when a later batch arrives) and after joining; a publisher with
        nothing new answers with just the end marker."""
        if self.mode == LIVE and self.has_replay and self.last is not None:
            self._probing = True
            self._begin(REPLAY)

    def on_snapshot_chunk(self, events: list) -> None:
        if self.mode == SNAPSHOT:
            self._snapshot_events.extend(e for e in events if e.__class__ is BlockStored)

    def on_snapshot_end(self, next_seq: int) -> None:
        if self.mode != SNAPSHOT:
            return
        events, self._snapshot_events = self._snapshot_events, []
        self.snapshot_supported = True
        self._joining = False
        self._snapshot_failed = False
        self.stats.snapshots += 1
        if self.last is not None and next_seq - 1 < self.last:
            self.stats.restarts += 1  # the publisher behind the endpoint is a new one
        self._clear_next = False  # the snapshot batch starts with AllBlocksCleared itself
        # The snapshot's state is as of now: stamp it with the time it arrived.
        batch = KVEventBatch(ts=time.time(), events=[AllBlocksCleared(), *events])
        self._emit(next_seq - 1, batch, SNAPSHOT)
        self.mode = LIVE
        self.late_copies.recovered(self.last)
        self._notify(self.name, SNAPSHOT_APPLIED, f"next seq {next_seq}")
        self._drain()
        if self._resync_after and self.mode == LIVE:  # asked before a reconnect: maybe stale
            self._resync_after = False
            self._begin(SNAPSHOT)
        else:
            self.probe()  # batches sent before our subscription took effect are in no pending list

    def on_reconnect(self) -> None:
        """The connection came back. A restarted publisher may already have passed our last seq,
        which no seq check can tell: resync from a snapshot when the source has them."""
        self.stats.reconnects += 1
        self.resync()

    def resync(self) -> None:
        """Replace everything delivered so far by a snapshot (when the source has them)."""
        if not self.has_replay or self.snapshot_supported is False:
            return
        if self.mode == LIVE:
            self._begin(SNAPSHOT)
        else:  # after the replay; or, if the snapshot request died with the old peer, once more
            self._resync_after = True

    # -- helpers --------------------------------------------------------------------------------
    def _drain(self) -> None:
        """Deliver waiting live batches, skipping those a replay or snapshot covered."""
        items = self.pending.take_all()
        prev = None
        for i, (seq, batch, payload_bytes) in enumerate(items):
            if self.mode != LIVE:  # a new gap opened: the rest waits again
                self.stats.pending_overflows += self.pending.put_back(items[i:])
                return
            restart_inside = prev is not None and seq <= prev
            prev = seq
            if not restart_inside and self.last is not None and seq <= self.last:
                continue
            self.on_live(seq, batch, payload_bytes)

    def _emit(self, seq: int, batch: KVEventBatch, kind: str = LIVE) -> None:
        if self._clear_next:
            self._clear_next = False
            batch = KVEventBatch(ts=batch.ts, events=[AllBlocksCleared(), *batch.events],
                                 data_parallel_rank=batch.data_parallel_rank)
        elif kind != SNAPSHOT and AllBlocksCleared in map(type, batch.events):
            self.stats.restarts += 1
        self.last = seq
        self.stats.last_seq = seq
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        self.delivering = kind
        self._deliver(self.name, seq, batch)
