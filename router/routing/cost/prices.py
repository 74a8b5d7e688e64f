"""One request's prices on every candidate: what ``cache_aware`` chooses by, as arrays, with each estimate on demand.

``choice`` (seconds, ``TTFTEstimate.choice_s``) and ``own_tokens`` are arrays over rows (``ids[row]`` is the
replica; rows that are not candidates cost +inf), so the cheapest and its ties are found without a Python loop over
the fleet. A candidate's full ``TTFTEstimate`` (its parts, its pace) is priced exactly when asked for
(``prices[replica_id]``: the chosen one, a session's pin) and kept; from a plain dict of loads every estimate is
priced up front (candidates.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.cost.estimate import TTFTEstimate


class Prices(Mapping[ReplicaId, TTFTEstimate]):
    """Replica id -> its ``TTFTEstimate`` for one request, over the candidates (a mapping), plus the arrays."""

    def __init__(self, ids: Sequence[ReplicaId], row_of: Callable[[ReplicaId], int | None], mask: np.ndarray,
                 choice: np.ndarray, own_tokens: np.ndarray, exact: dict[ReplicaId, TTFTEstimate],
                 price_one: Callable[[ReplicaId], TTFTEstimate] | None = None) -> None:
        self.ids = ids
        """Row -> replica id."""
        self.row_of = row_of
        """A replica's row (None: not laid out)."""
        self.mask = mask
        """Bool per row: a candidate."""
        self.choice = choice
        """Per row: ``choice_s`` there (+inf: not a candidate)."""
        self.own_tokens = own_tokens
        """Per row: prompt tokens it computes there."""
        self._exact = exact
        self._price_one = price_one

    @classmethod
    def of(cls, estimates: dict[ReplicaId, TTFTEstimate]) -> Prices:
        """Prices of estimates already made, one per candidate (in the candidates' order)."""
        ids = list(estimates)
        values = estimates.values()
        return cls(ids, {rid: i for i, rid in enumerate(ids)}.get, np.ones(len(ids), dtype=bool),
                   np.array([e.choice_s for e in values], dtype=np.float64),
                   np.array([e.own_tokens for e in values], dtype=np.int64), estimates)

    @property
    def rows(self) -> np.ndarray:
        """The candidates' rows, in order."""
        return np.flatnonzero(self.mask)

    def __getitem__(self, replica_id: ReplicaId) -> TTFTEstimate:
        found = self._exact.get(replica_id)
        if found is not None:
            return found
        if self._price_one is None or replica_id not in self:
            raise KeyError(replica_id)
        found = self._exact[replica_id] = self._price_one(replica_id)
        return found

    def __contains__(self, replica_id: object) -> bool:
        row = self.row_of(replica_id)  # type: ignore[arg-type]  # a Mapping is asked with any key
        return row is not None and bool(self.mask[row])

    def __iter__(self) -> Iterator[ReplicaId]:
        ids = self.ids
        return (ids[row] for row in self.rows.tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self.mask))
