"""The replicas a request may go to, as a policy gets them (``Candidates``, router/routing/candidates.py): the
routable records (healthy, ready, not of role prefill) less the excluded, within the request's model pool.

The routable set is kept while the replica set and its health stand (``ReplicaSet.version``, the columns' layout);
a request with exclusions or a pool gets a mask over it. Fleets of at least ``COLUMNS_FROM`` replicas get their
loads as ``CandidateLoads`` (priced from the load columns in one vectorised pass), smaller ones as a plain dict."""

from __future__ import annotations

import numpy as np
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.cost import FleetRates
from kvmesh.router.routing.cost.load_columns import CandidateLoads, LoadColumns

COLUMNS_FROM = 6
"""Fleets of at least this many replicas are priced from the load columns in one vectorised pass, smaller ones one
replica at a time (numpy's fixed cost per array pass outweighs a few estimates in Python); the decisions are the
same either way."""


class RoutableLoads:
    """The routable replicas of one router (call under its lock)."""

    def __init__(self, replicas: ReplicaSet, columns: LoadColumns) -> None:
        self.replicas = replicas
        self.columns = columns
        self._routable: tuple[object, CandidateLoads] | None = None
        """(the set's and columns' versions, the routable replicas' loads) as last made."""

    def candidates(self, excluded: set, pool: frozenset | None = None) -> Candidates:
        """The routable replicas less ``excluded``, within ``pool`` (None: any)."""
        columns = self.columns
        small = len(self.replicas) < COLUMNS_FROM
        columns.sync(rows=not small)
        key = (columns.version, self.replicas.version)
        if self._routable is None or self._routable[0] != key:  # kept while the replica set and health stand
            mask = np.array([r.routable for r in columns.records], dtype=bool)
            self._routable = key, CandidateLoads(columns, mask, key)
        routable = self._routable[1]
        if small:
            plain = routable.plain()
            records = [columns.records[row] for row in routable.rows.tolist()]
            if excluded or pool is not None:
                records = [r for r in records if r.id not in excluded and (pool is None or r.id in pool)]
                plain = {r.id: plain[r.id] for r in records}
            return Candidates(plain, records)
        if not excluded and pool is None:
            return Candidates(routable)
        mask, row = routable.mask.copy(), columns.row
        for rid in excluded:
            if (i := row(rid)) is not None:
                mask[i] = False
        if pool is not None:
            mask &= np.isin(np.arange(len(mask)), [i for r in pool if (i := row(r)) is not None])
        return Candidates(CandidateLoads(columns, mask))

    def fleet_rates(self) -> FleetRates:
        """The rates of every replica (router/routing/cost/fleet.py), from the columns as ``loads`` keeps them (a small
        fleet's are not synced: from its records)."""
        columns = self.columns
        if len(columns.ids) < COLUMNS_FROM:
            return FleetRates.of([r.load for r in self.replicas.records()])
        return columns.fleet(columns.everyone, ("all", columns.version))
