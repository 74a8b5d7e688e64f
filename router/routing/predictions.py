"""Predicted entries of the prefix index (``PrefixIndex.predictions``, router/routing/index.py).

When the router sends a request to a replica, it credits that replica with the request's blocks
for ``predict_ttl_s`` seconds, before the replica's BlockStored events can arrive. A burst of
requests sharing a new prefix then follows the first one instead of scattering. A held prediction
(``predict_held``) lasts until its request's first bytes (``release``: the prompt is computed, its
blocks are stored) and ``predict_ttl_s`` after, or until its backstop: a long prompt still being
computed, or waiting behind others, is not forgotten half-way.

Predicted bits live in the index's ``blocks`` masks like real ones (so matching needs no second
lookup) and are also recorded in ``predicted`` (key -> bits predicted but not real). Invariant:
a bit is never both predicted and real -- a real BlockStored for a predicted block *confirms* it
(the bit leaves ``predicted``); expiry removes only bits still unconfirmed.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import and_, or_


class Predictions:
    """predict / confirm / expire over the index's ``blocks`` masks (shared, not copied)."""

    __slots__ = ("backstops", "blocks", "held", "predicted", "queue", "tickets", "ttl_s", "version")

    def __init__(self, blocks: dict[int, int], ttl_s: float) -> None:
        if ttl_s < 0:
            raise ValueError(f"predict_ttl_s must be >= 0, got {ttl_s}")
        self.blocks = blocks
        """The index's router_key -> replica bits (real and predicted); this object updates it in place."""
        self.predicted: dict[int, int] = {}
        """router_key -> bits predicted but not (yet) real."""
        self.queue: deque[tuple[float, int, list[int]]] = deque()
        """(expiry time, replica bit, keys) in the order they were predicted."""
        self.ttl_s = ttl_s
        """How long a routed request's blocks count as held by its replica before events confirm them."""
        self.held: dict[int, tuple[int, list[int]]] = {}
        """ticket -> (replica bit, keys) of the held predictions (``predict_held``) not yet released."""
        self.backstops: list[tuple[float, int]] = []
        """Heap of (time a held prediction expires unreleased, its ticket); released tickets are skipped."""
        self.tickets = itertools.count(1)
        self.version = 0
        """Counts the changes of ``blocks`` that may change a match: predictions made or expired here, the index's
        events and replicas (router/routing/index.py). A match holds while the version stays and none is ``due``."""

    def predict(self, bit: int, keys: Sequence[int], now: float | None = None, start: int = 0) -> int:
        """Credit the replica owning ``bit`` with ``keys[start:]`` for ``ttl_s``; returns newly credited
        blocks. ``start`` may be the replica's match length (those blocks are held already)."""
        if len(keys) <= start or self.ttl_s <= 0:
            return 0
        now = time.monotonic() if now is None else now
        added = self._add(bit, keys, now, start)
        if added:
            self.queue.append((now + self.ttl_s, bit, added))
        return len(added)

    def predict_held(self, bit: int, keys: Sequence[int], now: float, start: int, hold_s: float) -> int | None:
        """``predict``, held until ``release(ticket)`` and ``ttl_s`` after it, at most ``hold_s`` unreleased; returns
        the ticket (None: nothing newly credited)."""
        if len(keys) <= start or self.ttl_s <= 0:
            return None
        added = self._add(bit, keys, now, start)
        if not added:
            return None
        ticket = next(self.tickets)
        self.held[ticket] = (bit, added)
        heapq.heappush(self.backstops, (now + max(hold_s, self.ttl_s), ticket))
        return ticket

    def release(self, ticket: int | None, now: float) -> None:
        """The held prediction's request sent its first bytes (or failed): it lasts ``ttl_s`` more."""
        entry = self.held.pop(ticket, None) if ticket is not None else None
        if entry is not None:
            self.queue.append((now + self.ttl_s, *entry))

    def _add(self, bit: int, keys: Sequence[int], now: float, start: int) -> list[int]:
        """Set ``bit`` on ``keys[start:]`` where it is not set (as predicted); the keys newly credited."""
        self.expire(now)
        blocks, predicted = self.blocks, self.predicted
        tail = keys[start:] if start else keys
        masks = list(map(blocks.get, tail, repeat(0)))
        if not any(map(and_, masks, repeat(bit))):  # the usual case: none held yet, update in C
            blocks.update(zip(tail, map(or_, masks, repeat(bit)), strict=False))
            predicted.update(zip(tail, map(or_, map(predicted.get, tail, repeat(0)), repeat(bit)), strict=False))
            added = list(tail)
        else:
            added = []
            for key, mask in zip(tail, masks, strict=False):
                if not mask & bit:
                    blocks[key] = mask | bit
                    predicted[key] = predicted.get(key, 0) | bit
                    added.append(key)
        if added:
            self.version += 1
        return added

    def real(self, keys: Sequence[int], matches: Mapping, entries: Mapping) -> dict:
        """``matches`` (replica id -> leading blocks of ``keys``, predictions included) cut at each replica's first
        block only predicted: what it holds for real, what a peer can pull from it now (``entries``: the index's
        entry per replica id, with its ``bit``)."""
        predicted = self.predicted
        if not predicted:
            return dict(matches)
        out = {}
        for rid, held in matches.items():
            bit, n = entries[rid].bit, 0
            while n < held and not predicted.get(keys[n], 0) & bit:
                n += 1
            out[rid] = n
        return out

    def confirm(self, key: int, bit: int) -> None:
        """A real BlockStored arrived for a predicted block: the bit stays, as a real one."""
        mask = self.predicted[key] & ~bit
        if mask:
            self.predicted[key] = mask
        else:
            del self.predicted[key]

    def unpredict(self, key: int, bit: int) -> None:
        """Withdraw a predicted bit from the index."""
        self.confirm(key, bit)
        mask = self.blocks.get(key, 0) & ~bit
        if mask:
            self.blocks[key] = mask
        else:
            self.blocks.pop(key, None)

    def forget(self, bit: int) -> None:
        """Withdraw every prediction of one replica (it was cleared or removed)."""
        for key in [k for k, m in self.predicted.items() if m & bit]:
            self.unpredict(key, bit)

    def due(self, now: float | None = None) -> bool:
        """Whether a prediction expires by ``now`` (None: the clock): a match taken before may not hold then."""
        queue, backstops = self.queue, self.backstops
        while backstops and backstops[0][1] not in self.held:  # released: its ttl is in the queue
            heapq.heappop(backstops)
        if not queue and not backstops:
            return False
        now = time.monotonic() if now is None else now
        return bool(queue) and queue[0][0] <= now or bool(backstops) and backstops[0][0] <= now

    def expire(self, now: float) -> None:
        """Withdraw the predictions older than ``ttl_s`` that no event confirmed."""
        queue, predicted, backstops = self.queue, self.predicted, self.backstops
        if queue and queue[0][0] <= now:
            self.version += 1
        while queue and queue[0][0] <= now:
            _, bit, keys = queue.popleft()
            for key in keys:
                if predicted.get(key, 0) & bit:
                    self.unpredict(key, bit)
        while backstops and backstops[0][0] <= now:  # held and never released: a request that vanished
            entry = self.held.pop(heapq.heappop(backstops)[1], None)
            if entry is not None:
                self.version += 1
                for key in entry[1]:
                    if predicted.get(key, 0) & entry[0]:
                        self.unpredict(key, entry[0])
