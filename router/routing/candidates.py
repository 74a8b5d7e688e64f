"""The replicas one request may go to, as a routing policy gets them: their records, in order.

A policy reads each candidate's load, tiers and measured rates from its record (``replica.load``) and answers
with the record it chose; it never looks a replica up by id. ``loads`` is the same candidates as the cost
(router/routing/cost/) prices them: ``CandidateLoads`` over the load columns (one vectorised pass) for a large
fleet, a plain dict for a small one; the records of the columns' candidates are made only when walked.

    Candidates.of(records)                 candidates from records (tests, the simulator's prefill pick)
    for replica in candidates: ...         a policy's walk, in the router's order (ties break by it)
    candidates.named(replica_id)          the candidate a price or a session names (None: not a candidate)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import overload

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.cost.load_columns import CandidateLoads


class Candidates(Sequence[Replica]):
    """The candidate records of one decision, with their loads keyed as the cost prices them."""

    __slots__ = ("_records", "_named", "loads")

    def __init__(self, loads: Mapping[str, ReplicaLoad], records: Sequence[Replica] | None = None) -> None:
        """``loads``: the candidates as the cost prices them; ``records``: theirs in the same order (None: the
        columns' records of a ``CandidateLoads``)."""
        self.loads = loads
        """The candidates' loads by their records' ids, for router/routing/cost/ (a policy walks the records)."""
        self._records: Sequence[Replica] | None = records
        self._named: dict[str, Replica] | None = None

    @classmethod
    def of(cls, records: Sequence[Replica]) -> Candidates:
        """Candidates from their records (their loads as the records hold them)."""
        return cls({r.id: r.load for r in records}, list(records))

    @property
    def records(self) -> Sequence[Replica]:
        if self._records is None:
            loads = self.loads
            if type(loads) is not CandidateLoads:
                raise TypeError("Candidates of a plain mapping need their records")
            everyone = loads.columns.records
            self._records = [everyone[row] for row in loads.rows.tolist()]
        return self._records

    def named(self, name: object) -> Replica | None:
        """The candidate that a price, a ring or a session names by its record's id; None: not a candidate."""
        loads = self.loads
        if self._records is None and type(loads) is CandidateLoads:  # the columns' row, without a dict of them all
            row = loads.columns.row(name)  # type: ignore[arg-type]  # any name may be asked
            return loads.columns.records[row] if row is not None and loads.mask[row] else None
        if self._named is None:
            self._named = {r.id: r for r in self.records}
        return self._named.get(name)  # type: ignore[call-overload]  # any name may be asked

    def only(self, *replicas: Replica) -> Candidates:
        """These candidates alone (a session's pin weighed against the policy's pick)."""
        return Candidates.of(list(dict.fromkeys(replicas)))

    def __contains__(self, replica: object) -> bool:
        return isinstance(replica, Replica) and self.named(replica.id) is replica

    @overload
    def __getitem__(self, i: int) -> Replica: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Replica]: ...

    def __getitem__(self, i: int | slice) -> Replica | Sequence[Replica]:
        loads = self.loads
        if self._records is None and isinstance(i, int) and type(loads) is CandidateLoads:
            return loads.columns.records[int(loads.rows[i])]  # one, without making all the candidates' records
        return self.records[i]

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.loads)

    def __bool__(self) -> bool:
        return len(self.loads) > 0
