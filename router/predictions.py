"""Predicted entries of the prefix index (mixed into ``PrefixIndex``, router/index.py).

When the router sends a request to a replica, it credits that replica with the request's blocks
for ``predict_ttl_s`` seconds, before the replica's BlockStored events can arrive. A burst of
requests sharing a new prefix then follows the first one instead of scattering.

Predicted bits live in the index's ``_blocks`` masks like real ones (so matching needs no second
lookup) and are also recorded in ``_predicted`` (key -> bits predicted but not real). Invariant:
a bit is never both predicted and real -- a real BlockStored for a predicted block *confirms* it
(the bit leaves ``_predicted``); expiry removes only bits still unconfirmed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import repeat
from operator import and_, or_


class PredictionMixin:
    """predict / confirm / expire over ``self._blocks``, ``self._predicted``, ``self._predict_queue``."""

    def predict(self, replica_id, keys: Sequence[int], now: float | None = None,
                start: int = 0) -> int:
        """Credit ``replica_id`` with ``keys[start:]`` for ``predict_ttl_s``; returns newly credited blocks.

        ``start`` may be the replica's match length (those blocks are held already).
        """
        tree = self._replicas.get(replica_id)
        if tree is None or len(keys) <= start or self.predict_ttl_s <= 0:
            return 0
        now = time.monotonic() if now is None else now
        self._expire(now)
        bit, blocks, predicted = tree.bit, self._blocks, self._predicted
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
            self._predict_queue.append((now + self.predict_ttl_s, bit, added))
        return len(added)

    def _confirm(self, key: int, bit: int) -> None:
        mask = self._predicted[key] & ~bit
        if mask:
            self._predicted[key] = mask
        else:
            del self._predicted[key]

    def _unpredict(self, key: int, bit: int) -> None:
        self._confirm(key, bit)
        mask = self._blocks.get(key, 0) & ~bit
        if mask:
            self._blocks[key] = mask
        else:
            self._blocks.pop(key, None)

    def _expire(self, now: float) -> None:
        queue, predicted = self._predict_queue, self._predicted
        while queue and queue[0][0] <= now:
            _, bit, keys = queue.popleft()
            for key in keys:
                if predicted.get(key, 0) & bit:
                    self._unpredict(key, bit)
