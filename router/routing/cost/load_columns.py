"""The replicas' loads as columns: one numpy array per field the cost reads, one row per replica, kept current.

Pricing a request on every candidate in Python costs interpreter time per replica; over a thousand replicas it is
most of a decision. The cost's vectorised pass (router/routing/cost/columns_price.py) reads these columns instead.
A ``ReplicaLoad`` calls its ``watcher`` whenever a field is set, which marks its row stale; ``sync`` re-reads the
stale rows only (a dispatch, a first token, a report touch one replica each), so what a decision pays does not grow
with the replicas that did not change. The fleet's slowest rates (cost/fleet.py) are reduced from the columns,
once per change of a rate or of the candidate set.

Rows follow the tracker's order (``LoadTracker.loads``, insertion order), so a scan of the rows visits replicas in
the order a scan of the dict does: ties break the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.measured import RATES, measured
from kvmesh.router.routing.load import LoadTracker

_MAX_FLEETS_KEPT = 8
"""Candidate sets whose ``FleetRates`` are kept (the routable replicas, all of them, a few pools)."""


class LoadColumns:
    """The loads of a ``LoadTracker`` as arrays (``sync`` before reading)."""

    def __init__(self, tracker: LoadTracker) -> None:
        self.tracker = tracker
        self._record = tracker.replicas.get
        """A replica's record (its load carries its row)."""
        self.records: list[Replica] = []
        """Row -> its replica's record (a replica's own row is on its load: ``ReplicaLoad.row``)."""
        self.ids: list[ReplicaId] = []
        """Row -> replica id."""
        self.loads: list[ReplicaLoad] = []
        """Row -> its load."""
        self.version: object = None
        """The tracker's ``members_version`` the rows were laid out for."""
        self._stale: set[int] = set()
        """Rows whose load changed since they were read."""
        self._rates: list[tuple] = []
        self.rates_version = 0
        """Rises whenever a row's rates change (what is derived from the rates alone is kept until then)."""
        self.derived: tuple[object, Any] | None = None
        """(key, rates) the price derived from the rows' rates and the fleet's priors (cost/columns_price.py)."""
        self._fleets: dict[object, tuple[int, FleetRates]] = {}
        self._reshape()

    def sync(self, rows: bool = True) -> None:
        """Re-read the rows that changed since the last call (every row after the replica set changed; ``rows``
        False: only that, the changed rows wait for a later call)."""
        if self.version != self.tracker.members_version:
            self._reshape()
        elif rows and self._stale:
            stale = list(self._stale)  # taken before the reads: a load set meanwhile (another thread) stays marked
            self._stale.difference_update(stale)
            loads = self.loads
            for row in stale:
                if row < len(loads):  # a removed replica's load may still mark its old row: a harmless re-read
                    self._read(row, loads[row])

    def _reshape(self) -> None:
        records = self.records = list(self.tracker.replicas)
        self.version = self.tracker.members_version
        n = len(records)
        self.ids, self.loads = [r.id for r in records], [r.load for r in records]
        self._rates = [()] * n
        self.rates_version += 1
        f8 = np.float64
        self.spt, self.h2d_spb, self.pull_spb, self.pull_fixed, self.lora_spb = (np.zeros(n, f8) for _ in range(5))
        """Seconds per prompt token / per byte loaded back / per byte pulled, a pull's fixed seconds, seconds per
        adapter byte (NaN: not measured)."""
        self.block_bytes, self.bytes_per_token = np.zeros(n, f8), np.zeros(n, f8)
        """Reported ``kv_block_bytes`` and ``kv_bytes_per_token`` (0: not reported)."""
        self.coef_valid = np.zeros(n, bool)
        """The replica measured its decode step (``coef0..2``: step_s, s_per_seq, s_per_context_token)."""
        self.coef0, self.coef1, self.coef2 = np.zeros(n, f8), np.zeros(n, f8), np.zeros(n, f8)
        self.backlog, self.batch, self.context = np.zeros(n, f8), np.zeros(n, f8), np.zeros(n, f8)
        """``prefill_backlog``, ``decode_load``, its running requests' context (reported, else estimated)."""
        self.hit_worth = np.zeros(n, f8)
        """``h / (1 - h)``: hit tokens a token cached there brings (``h`` its recent hit fraction, capped)."""
        self.offset, self.scale, self.arrival = np.zeros(n, f8), np.zeros(n, f8), np.zeros(n, f8)
        """The TTFT correction's offset and scale, the arrival rate."""
        self.recent_prefill = np.zeros(n, f8)
        """Prompt tokens this router sent to be computed there, decayed (``cache_aware_tokens``' churn)."""
        self.evicting = np.zeros(n, f8)
        """Share of its stores that evict (``ReplicaLoad.evicting``: how far its churn counts)."""
        self.prompt_per_kv_block = np.zeros(n, f8)
        """``ReplicaLoad.prompt_per_kv_block``: how far its requests fill its cache (``cache_aware_tokens``)."""
        self.kv_transfer, self.has_lora = np.zeros(n, bool), np.zeros(n, bool)
        self.everyone = np.ones(n, bool)
        """Every row (the mask of ``fleet`` over all replicas)."""
        stale = self._stale
        stale.clear()  # every row is read now
        for row, load in enumerate(self.loads):
            load.watch(_marker(stale, row), row)
            self._read(row, load)

    def row(self, replica_id: ReplicaId) -> int | None:
        """The replica's row in the current layout (None: not laid out, e.g. added since the last ``sync``)."""
        replica = self._record(replica_id)
        if replica is None:
            return None
        row, ids = replica.load.row, self.ids
        return row if row is not None and row < len(ids) and ids[row] == replica_id else None

    def _read(self, row: int, load: ReplicaLoad) -> None:
        """Copy ``load``'s fields into ``row``, as the price reads them (measured.py)."""
        m = measured(load)
        rates = m[:RATES]
        if rates != self._rates[row]:
            self._rates[row] = rates
            self.rates_version += 1
            (self.spt[row], self.h2d_spb[row], self.pull_spb[row], self.pull_fixed[row], self.lora_spb[row],
             self.block_bytes[row], self.coef_valid[row], self.coef0[row], self.coef1[row], self.coef2[row]) = rates
        (self.bytes_per_token[row], self.backlog[row], self.batch[row], self.context[row], self.hit_worth[row],
         self.arrival[row], self.offset[row], self.scale[row]) = m[RATES:]
        self.recent_prefill[row] = load.recent_prefill
        self.evicting[row] = load.evicting
        self.prompt_per_kv_block[row] = load.prompt_per_kv_block
        self.kv_transfer[row], self.has_lora[row] = load.kv_transfer_enabled, load.lora is not None

    def fleet(self, mask: np.ndarray, key: object = None) -> FleetRates:
        """``FleetRates.of`` the rows in ``mask``; ``key`` names the mask (the same key, the same rows) so the
        answer is kept until a rate changes (None: not kept)."""
        cached = self._fleets.get(key) if key is not None else None
        if cached is not None and cached[0] == self.rates_version:
            return cached[1]
        coef = mask & self.coef_valid
        decode = ((float(self.coef0[coef].max()), float(self.coef1[coef].max()), float(self.coef2[coef].max()))
                  if coef.any() else None)
        block = self.block_bytes[mask]
        block = block[block != 0]
        fleet = FleetRates(_slowest(self.spt, mask), decode, _slowest(self.h2d_spb, mask),
                           _slowest(self.pull_spb, mask), _slowest(self.pull_fixed, mask),
                           _slowest(self.lora_spb, mask), int(block.max()) if block.size else None)
        if key is not None:
            if len(self._fleets) >= _MAX_FLEETS_KEPT:
                self._fleets.clear()
            self._fleets[key] = (self.rates_version, fleet)
        return fleet


def _marker(stale: set, row: int):
    """A load's watcher: its row is stale."""
    return lambda: stale.add(row)


def _slowest(column: np.ndarray, mask: np.ndarray) -> float | None:
    """The largest measured (not NaN) value of ``column`` over ``mask`` (None: none measured)."""
    values = column[mask]
    values = values[~np.isnan(values)]
    return float(values.max()) if values.size else None


class CandidateLoads(Mapping[ReplicaId, ReplicaLoad]):
    """The candidate replicas of one decision: a mapping of id -> load, as policies take it, that also carries the
    columns (``mask``: the candidates' rows) so the cost prices them all in one vectorised pass. A policy that walks
    the candidates walks a plain dict of them, made once (the router keeps one per candidate set)."""

    def __init__(self, columns: LoadColumns, mask: np.ndarray, fleet_key: object = None) -> None:
        self.columns = columns
        self.mask = mask
        """Bool per row: the replica is a candidate."""
        self.fleet_key = fleet_key
        """Names ``mask`` for ``LoadColumns.fleet``'s cache (None: a one-off set, e.g. with exclusions)."""
        self._rows: np.ndarray | None = None
        self._outside: np.ndarray | None = None
        self._plain: dict[ReplicaId, ReplicaLoad] | None = None

    @property
    def rows(self) -> np.ndarray:
        """The candidates' rows, in order."""
        if self._rows is None:
            self._rows = np.flatnonzero(self.mask)
        return self._rows

    @property
    def outside(self) -> np.ndarray:
        """Bool per row: not a candidate."""
        if self._outside is None:
            self._outside = ~self.mask
        return self._outside

    def plain(self) -> dict[ReplicaId, ReplicaLoad]:
        """The candidates as a dict, in order."""
        if self._plain is None:
            ids, loads = self.columns.ids, self.columns.loads
            self._plain = {ids[row]: loads[row] for row in self.rows.tolist()}
        return self._plain

    def fleet(self) -> FleetRates:
        return self.columns.fleet(self.mask, self.fleet_key)

    def __getitem__(self, replica_id: ReplicaId) -> ReplicaLoad:
        if self._plain is not None:
            return self._plain[replica_id]
        row = self.columns.row(replica_id)
        if row is None or not self.mask[row]:
            raise KeyError(replica_id)
        return self.columns.loads[row]

    def __contains__(self, replica_id: object) -> bool:
        row = self.columns.row(replica_id)  # type: ignore[arg-type]  # a Mapping is asked with any key
        return row is not None and bool(self.mask[row])

    def __iter__(self) -> Iterator[ReplicaId]:
        return iter(self.plain())

    def __len__(self) -> int:
        return len(self.rows)

    def keys(self):
        return self.plain().keys()

    def items(self):
        return self.plain().items()

    def values(self):
        return self.plain().values()
