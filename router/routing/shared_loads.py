"""In-flight counts shared by the router processes of one host (``--workers N``, ``router.workers``).

Each worker process routes by its own ``LoadTracker``; without sharing, each sees only the
requests it sent itself (a quarter of them with 4 workers) and bursts pile onto one replica
between two ``/load`` polls (BENCHMARKS.md, "Several routers"). The table is shared memory, one row per
worker, one column (slot) per replica, two counters per cell::

                slot 0 (replica-0)   slot 1 (replica-1)   ...
    row 0       in_flight, pending   in_flight, pending        <- written by worker 0 only
    row 1       in_flight, pending   ...                       <- written by worker 1 only

A worker stores its own counts into its own row (one writer per cell: no lock), and a reader sums
the other rows into ``ReplicaLoad.peer_in_flight`` / ``peer_pending_prefill_tokens`` before the
policy looks. A reader with no row of its own (serve's control router) sums them all.

Replica ids map to slots through a name table in the same shared memory. A slot is assigned
under a lock the first time any process sees the id and is never reassigned, so every process
agrees on it without talking; re-registering an id (serve's ``replica-<i>`` after a restart)
keeps its slot. Ids past ``max_replicas`` distinct ones are counted locally only (logged once).
The arrays are multiprocessing RawArrays: they reach the workers as arguments of the spawned
processes (pickled at spawn), and die with the last process holding them.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import operator

from kvmesh.router.replicas.replica import ReplicaId

logger = logging.getLogger(__name__)

NAME_BYTES = 64
"""Bytes of a slot's name (longer replica ids are stored as their digest)."""
_FIELDS = 2  # in_flight, pending_prefill_tokens


class SharedLoadTable:
    """``num_rows`` writers x ``max_replicas`` slots of (in_flight, pending prefill tokens)."""

    def __init__(self, num_rows: int, max_replicas: int = 256, context=None) -> None:
        if num_rows < 1 or max_replicas < 1:
            raise ValueError(f"num_rows and max_replicas must be >= 1, got {num_rows}, {max_replicas}")
        ctx = context or mp.get_context("spawn")
        self.num_rows = num_rows
        self.max_replicas = max_replicas
        self._counts = ctx.RawArray("q", num_rows * max_replicas * _FIELDS)
        self._names = ctx.RawArray("c", max_replicas * NAME_BYTES)
        self._lock = ctx.Lock()  # only for assigning a slot to a new replica id
        self.healthy_seen = ctx.RawArray("q", num_rows)
        """Per row: how many healthy replicas that worker routes to (serve waits until all see them)."""
        self._view = memoryview(self._counts).cast("B").cast("q")  # fast reads and writes (C, no ctypes objects)

    def __getstate__(self) -> dict:
        return {"num_rows": self.num_rows, "max_replicas": self.max_replicas, "_counts": self._counts,
                "_names": self._names, "_lock": self._lock, "healthy_seen": self.healthy_seen}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._view = memoryview(self._counts).cast("B").cast("q")

    # ---------------------------------------------------------------- slots
    def slot(self, replica_id: ReplicaId) -> int | None:
        """The replica's column (assigned on first sight); None when the table is full. A scan of the name table under
        its lock: the caller keeps the answer (``ReplicaLoad.shared_slot``)."""
        name = _name(replica_id)
        with self._lock:
            names, free = self._names, None
            for i in range(self.max_replicas):
                held = names[i * NAME_BYTES:(i + 1) * NAME_BYTES].rstrip(b"\0")
                if held == name:
                    slot = i
                    break
                if not held and free is None:
                    free = i
            else:
                slot = free
                if slot is not None:
                    names[slot * NAME_BYTES:slot * NAME_BYTES + len(name)] = name
        if slot is None:
            logger.warning("shared load table full (%d replica ids); %s is counted by each router process alone",
                           self.max_replicas, replica_id)
        return slot

    # ---------------------------------------------------------------- counts
    def write(self, row: int, slot: int, in_flight: int, pending_prefill_tokens: int) -> None:
        """Store one writer's counts for one replica (only that writer calls this for ``row``)."""
        i = (row * self.max_replicas + slot) * _FIELDS
        view = self._view
        view[i] = in_flight
        view[i + 1] = pending_prefill_tokens

    def peers(self, own_row: int | None, num_slots: int) -> list[int]:
        """Slots ``0..num_slots-1`` summed over every row but ``own_row``: ``[in_flight, pending]`` per
        slot, flat (slot ``i`` at ``2i``, ``2i + 1``)."""
        counts, stride, width = self._view, self.max_replicas * _FIELDS, num_slots * _FIELDS
        total = None
        for row in range(self.num_rows):
            if row != own_row:
                start = row * stride
                chunk = counts[start:start + width].tolist()  # one C-level copy per row
                total = chunk if total is None else list(map(operator.add, total, chunk))
        return total or [0] * width

    def clear_row(self, row: int) -> None:
        """Zero a writer's row (its process exited: the requests it counted are gone)."""
        size = self.max_replicas * _FIELDS
        self._view[row * size:(row + 1) * size] = memoryview(bytes(8 * size)).cast("q")
        self.healthy_seen[row] = 0


def _name(replica_id: ReplicaId) -> bytes:
    name = str(replica_id).encode()
    if len(name) > NAME_BYTES or not name:
        name = b"#" + hashlib.blake2b(name, digest_size=(NAME_BYTES - 2) // 2).hexdigest().encode()
    return name
