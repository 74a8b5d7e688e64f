"""Live batches a ``SourceTracker`` holds while a gap is being recovered, bounded in count and bytes.

A source keeps sending while its replay or snapshot is under way; what it sends waits here, decoded.
Without a byte bound a source sending huge (valid) batches during a slow recovery could make the
subscriber hold gigabytes, so both the number of batches and their payload bytes are
capped: past either cap the oldest batches are dropped (counted by the caller) -- they are then
missing like any lost batch, and the recovery that follows replays or snapshots them.
"""

from __future__ import annotations

from collections import deque

from kvmesh.events.schema import KVEventBatch


class PendingBatches:
    """A FIFO of ``(seq, batch, payload_bytes)``; see the module doc."""

    __slots__ = ("max_batches", "max_bytes", "bytes", "_items")

    def __init__(self, max_batches: int, max_bytes: int) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.bytes = 0
        """Payload bytes of the batches held (a decoded batch takes a few times its payload)."""
        self._items: deque[tuple[int, KVEventBatch, int]] = deque()

    def append(self, seq: int, batch: KVEventBatch, payload_bytes: int) -> int:
        """Hold one batch; returns how many of the oldest had to go to stay within the caps. The
        newest batch is always kept, even alone over ``max_bytes`` (it passed the decode limit)."""
        self._items.append((seq, batch, payload_bytes))
        self.bytes += payload_bytes
        dropped = 0
        while len(self._items) > 1 and (len(self._items) > self.max_batches or self.bytes > self.max_bytes):
            self.bytes -= self._items.popleft()[2]
            dropped += 1
        return dropped

    def take_all(self) -> list[tuple[int, KVEventBatch, int]]:
        """Every held batch, oldest first; the queue is empty afterwards."""
        items = list(self._items)
        self.clear()
        return items

    def put_back(self, items: list[tuple[int, KVEventBatch, int]]) -> int:
        """Hold ``items`` again (the rest of a drain that stopped at a new gap), oldest first;
        returns how many had to go (as ``append``)."""
        return sum(self.append(seq, batch, payload_bytes) for seq, batch, payload_bytes in items)

    def first_seq(self) -> int | None:
        return self._items[0][0] if self._items else None

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)
