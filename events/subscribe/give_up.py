"""When a source's recovery fails (``SourceTracker``'s part, tracker.py): a replay or snapshot that got no usable
answer is asked again, tried the other way, or given up -- the loss counted, told to the consumer, and delivery
resumed from the oldest waiting batch (or the next to arrive).
"""

from __future__ import annotations

from kvmesh.events.schema import BlockStored
from kvmesh.events.subscribe.consumer import StatusCallback
from kvmesh.events.subscribe.health import SNAPSHOT_FAILED, UNRECOVERED
from kvmesh.events.subscribe.pending import PendingBatches
from kvmesh.events.subscribe.source_log import SourceLog
from kvmesh.events.subscribe.stats import SourceStats

LIVE, REPLAY, SNAPSHOT = "live", "replay", "snapshot"
"""A ``SourceTracker``'s modes: following live, or waiting for the answer to a replay or a snapshot request."""


class GivingUp:
    """``SourceTracker``'s failed requests and give-ups (its state and ``_begin``/``_drain`` are the tracker's)."""

    name: str
    mode: str
    last: int | None
    stats: SourceStats
    pending: PendingBatches
    log: SourceLog
    snapshot_supported: bool | None
    _notify: StatusCallback
    _snapshot_events: list[BlockStored]
    _joining: bool
    _probing: bool
    _resync_after: bool
    _snapshot_failed: bool
    _accept_next: bool

    def _begin(self, kind: str | None) -> None:
        raise NotImplementedError  # the tracker's: ask for a replay or a snapshot

    def _drain(self) -> None:
        raise NotImplementedError  # the tracker's: deliver the waiting batches that are in order

    def on_request_failed(self, kind: str, reason: str, unsupported: bool = False) -> None:
        """A replay/snapshot got no (usable) answer: timeout, or a source without snapshots."""
        if self.mode != kind:
            return
        if kind == SNAPSHOT and self._resync_after:  # asked before a reconnect: ask again
            self._resync_after = False
            self._begin(SNAPSHOT)
            return
        if kind == SNAPSHOT:
            self.stats.snapshot_failures += 1
            self._snapshot_events = []
            self._snapshot_failed = True
            if unsupported:
                self.snapshot_supported = False
            self._notify(self.name, SNAPSHOT_FAILED, reason)
            if self._joining:  # a vLLM source: the replay buffer may still reach back to seq 0
                self._joining = False
                self.last = -1
                self._begin(REPLAY)
                return
            self._gave_up(reason)
        elif self._probing:  # a probe is optional: carry on with what is waiting
            self._probing = False
            self.mode = LIVE
            self._drain()
        else:
            self._probing = False
            if self._snapshot_failed:  # this recovery already tried one: do not wait twice
                self._gave_up(reason)
            else:
                self._begin(SNAPSHOT)

    def _lost(self, reason: str) -> None:
        self.stats.unrecovered += 1
        self.log.lost(reason)
        self._notify(self.name, UNRECOVERED, reason)

    def _gave_up(self, reason: str) -> None:
        """Accept the loss and resume from the oldest waiting batch (or the next to arrive)."""
        self._lost(reason)
        self._joining = self._snapshot_failed = False
        self.mode = LIVE
        if self.pending:
            self.last = self.pending.first_seq() - 1
            self._drain()
        else:
            self.last = None
            self._accept_next = True
