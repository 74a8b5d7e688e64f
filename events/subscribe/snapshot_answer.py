"""The answer to a snapshot request, frame by frame: ``[SNAPSHOT_TAG, next_seq, payload]``, read against
the subscriber's limits. ``ReplayRequests`` sends the request and acts on what each frame turns out to be::

    chunk, chunk, ..., then an empty payload      the end; next_seq is where the live stream goes on
    an empty payload with END_SEQ                 the publisher is busy: ask again after a back-off
    a bad seq frame, an undecodable chunk,        the snapshot is given up (SnapshotFailure)
    more than max_snapshot_bytes / max_source_blocks so far
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.events.codec import check_batch
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.schema import KVEvent
from kvmesh.events.subscribe.frame_guard import FrameGuard
from kvmesh.events.wire import END_SEQ, unpack_seq


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Part of the snapshot: its events, for the tracker."""

    events: list[KVEvent]


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """The snapshot is over: whole up to ``next_seq``, or never begun because the publisher is ``busy``."""

    next_seq: int
    busy: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotFailure:
    """Why the snapshot is given up; the frame is counted under ``counter`` (None: counted already)."""

    counter: str | None
    what: str
    detail: str


class SnapshotAnswers:
    """The size of the snapshot under way from each source, checked as its chunks arrive."""

    def __init__(self, config: SubscriberConfig, guard: FrameGuard) -> None:
        self._config, self._guard = config, guard
        self._blocks: dict[str, int] = {}  # source -> blocks of the snapshot under way
        self._bytes: dict[str, int] = {}  # source -> payload bytes of the snapshot under way

    def start(self, name: str) -> None:
        """A snapshot request of ``name`` is about to be sent: nothing received yet."""
        self._blocks[name] = self._bytes[name] = 0

    def read(self, name: str, body: list[bytes]) -> SnapshotChunk | SnapshotEnd | SnapshotFailure:
        """What the frames ``[SNAPSHOT_TAG, next_seq, payload]`` from ``name`` are (module doc)."""
        if len(body[1]) != 8:
            return SnapshotFailure("decode_errors", "bad snapshot frames",
                                   f"seq frame of {len(body[1])} bytes; expected 8")
        next_seq, payload = unpack_seq(body[1]), body[2]
        if not payload:
            return SnapshotEnd(next_seq, busy=body[1] == END_SEQ)
        cfg = self._config
        size = self._bytes[name] = self._bytes.get(name, 0) + len(payload)
        if size > cfg.snapshot_bytes():  # refused before decoding: held decoded, it costs ~5x
            return SnapshotFailure("rejected", "snapshot too large",
                                   f"more than max_snapshot_bytes={cfg.snapshot_bytes()} bytes")
        batch = self._guard.decode(name, payload)
        if batch is None:
            return SnapshotFailure(None, "", "a snapshot chunk could not be decoded")
        held = self._blocks[name] = self._blocks.get(name, 0) + check_batch(batch, cfg.max_batch_blocks)
        if held > cfg.max_source_blocks:
            return SnapshotFailure("rejected", "snapshot too large",
                                   f"more than max_source_blocks={cfg.max_source_blocks} blocks")
        return SnapshotChunk(batch.events)
