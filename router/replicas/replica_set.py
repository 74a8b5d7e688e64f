"""The router's replicas: one ``Replica`` record per id, and who is told when one comes or goes.

``KVRouter`` (router/routing/kv_router.py) owns the set and shares its lock with it; ``RouterRuntime``
(router/control/runtime.py) and the simulator add and remove replicas through the router. Listeners subscribe to
additions and removals:

    under the lock   the prefix index (a slot), the loads (columns, shared counts), the sessions pinned to it
    after it         the event feed (its source), metrics, the KV peers (the set they are told)

so a removal is ``ReplicaSet.remove``: the record goes, and with it everything the router knew of the replica.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator

from kvmesh.router.replicas.replica import READY, Replica, ReplicaId

Listener = Callable[[Replica], object]


class ReplicaSet:
    """See the module doc. Iteration is in the order replicas were added (ties between candidates break by it)."""

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self.lock = lock or threading.Lock()
        """Taken by ``add`` and ``remove`` while the locked listeners run (the router's decision lock)."""
        self._by_id: dict[ReplicaId, Replica] = {}
        self.version = 0
        """Rises whenever a replica comes, goes or changes whether it is a candidate (kept derivations check it)."""
        self.members_version = 0
        """Rises whenever a replica comes or goes."""
        self.num_prefill = 0
        """Replicas of role prefill (a fleet without any skips the split's pricing at once)."""
        self._locked: tuple[list[Listener], list[Listener]] = ([], [])
        self._after: tuple[list[Listener], list[Listener]] = ([], [])

    # ---------------------------------------------------------------- listeners
    def on_added(self, listener: Listener, locked: bool = False) -> None:
        """Call ``listener(replica)`` after each addition (``locked``: while ``lock`` is held)."""
        (self._locked if locked else self._after)[0].append(listener)

    def on_removed(self, listener: Listener, locked: bool = False) -> None:
        """Call ``listener(replica)`` after each removal (``locked``: while ``lock`` is held)."""
        (self._locked if locked else self._after)[1].append(listener)

    # ---------------------------------------------------------------- membership
    def add(self, replica: Replica) -> Replica:
        """Register ``replica``; one already there under its id is kept (its role and health updated from
        ``replica``'s, its load and history kept) and no listener is called."""
        with self.lock:
            known = self._by_id.get(replica.id)
            if known is not None:
                known.role, known.spec = replica.role, replica.spec or known.spec
                if replica.healthy:
                    known.healthy, known.state = True, READY
                self._changed_members()
                return known
            self._by_id[replica.id] = replica
            replica.removed = False
            self._changed_members()
            for listener in self._locked[0]:
                listener(replica)
        for listener in self._after[0]:
            listener(replica)
        return replica

    def remove(self, replica_id: ReplicaId) -> Replica | None:
        """Forget the replica (None: not there); its listeners learn it."""
        with self.lock:
            replica = self._by_id.pop(replica_id, None)
            if replica is None:
                return None
            replica.removed = True
            self._changed_members()
            for listener in self._locked[1]:
                listener(replica)
        for listener in self._after[1]:
            listener(replica)
        return replica

    def _changed_members(self) -> None:
        self.version += 1
        self.members_version += 1
        self.num_prefill = sum(r.prefill_only for r in self._by_id.values())

    def changed(self) -> None:
        """A replica's health or role changed: what was derived from the candidates is stale."""
        self.version += 1

    # ---------------------------------------------------------------- reading
    def get(self, replica_id: ReplicaId) -> Replica | None:
        return self._by_id.get(replica_id)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._by_id

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def records(self):
        """The records, live (no copy: call under ``lock`` or on the thread that changes the set)."""
        return self._by_id.values()

    def candidates(self, pool: Collection[ReplicaId] | None = None,
                   exclude: Collection[ReplicaId] = ()) -> list[Replica]:
        """The replicas a request may decode on: healthy, not of role prefill, not in ``exclude``, in ``pool`` (the
        replicas serving its model; None: any)."""
        return [r for r in self._by_id.values()
                if r.routable and r.id not in exclude and (pool is None or r.id in pool)]

    def healthy_ids(self) -> frozenset[ReplicaId]:
        """Replicas that may receive requests (any role)."""
        return frozenset(rid for rid, r in self._by_id.items() if r.healthy)

    def prefill(self, pool: Collection[ReplicaId] | None = None) -> list[Replica]:
        """Replicas of role prefill (in ``pool`` when given), in the order they were added."""
        return [r for rid, r in self._by_id.items() if r.prefill_only and (pool is None or rid in pool)]

    def healthy_within(self, excluded: Collection[ReplicaId], pool: Collection[ReplicaId] | None) -> set[ReplicaId]:
        """Healthy replicas of any role, less ``excluded``, within ``pool`` when given."""
        return {rid for rid, r in self._by_id.items()
                if r.healthy and rid not in excluded and (pool is None or rid in pool)}
