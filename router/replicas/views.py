"""Read-only views of one field of every replica's record, keyed by replica id (``FieldView``): what used to be a map
of its own in the class that used it, now read through the set (router/replicas/replica_set.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet

FIELDS: dict[str, Callable[[Replica], Any]] = {
    "load": lambda r: r.load,
    "spec": lambda r: r.spec,
    "accepts": lambda r: r.accepts,
}
"""The fields a view may show, each read by a function of this module (a request's path stays in one file)."""


class FieldView(Mapping):
    """Replica id -> its record's ``field`` (one of ``FIELDS``), for the replicas where that is not None."""

    __slots__ = ("_read", "_replicas")

    def __init__(self, replicas: ReplicaSet, field: str) -> None:
        self._replicas, self._read = replicas, FIELDS[field]

    def __getitem__(self, replica_id: ReplicaId) -> Any:
        value = self.get(replica_id)
        if value is None:
            raise KeyError(replica_id)
        return value

    def get(self, replica_id: ReplicaId, default: Any = None) -> Any:
        replica = self._replicas.get(replica_id)
        value = None if replica is None else self._read(replica)
        return default if value is None else value

    def __contains__(self, replica_id: object) -> bool:
        return self.get(replica_id) is not None  # type: ignore[arg-type]  # a Mapping is asked with any key

    def __iter__(self) -> Iterator[ReplicaId]:
        return iter([rid for rid, _ in self.items()])

    def __len__(self) -> int:
        return len(self.items())

    def values(self) -> list[Any]:  # type: ignore[override]  # a list (a snapshot), not a live view
        return [value for _, value in self.items()]

    def items(self) -> list[tuple[ReplicaId, Any]]:  # type: ignore[override]  # a list (a snapshot), not a live view
        read = self._read
        return [(r.id, value) for r in self._replicas.records() if (value := read(r)) is not None]
