"""The router's side of a fleet's token buckets: every ``fleet_sync_s`` it exchanges its tenants' token totals
with the other routers through the database (quota_store.py) and charges theirs to its copies of the buckets
(router/admission/fleet_ledger.py).

    tick (every fleet_sync_s)   an exchange in a thread, unless the last one is still running
                                no exchange has succeeded for fleet_stale_s -> each bucket refills at
                                1 / (routers alive at the last success) of its rate, until one succeeds

Off the request path: a request never waits for the database. A router is this process (``router``, random at
each start: a restarted router's totals start at 0 under a new name); routers alive are the groups (one per host's
shared memory, one per process otherwise) whose heartbeat grew within ``fleet_stale_s`` of this router's clock.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvmesh.router.admission.fleet_ledger import FleetLedger
from kvmesh.router.admission.shared_ledger import SharedLedger
from kvmesh.router.control.quota_store import HEARTBEAT, QuotaStore, QuotaUnavailable, open_quota_store

if TYPE_CHECKING:
    from kvmesh.replica.openai.responses_api.store_config import ResponsesStoreConfig
    from kvmesh.router.http.admission_gate import AdmissionGate

logger = logging.getLogger(__name__)


class QuotaSync:
    """Exchanges ``ledger``'s totals through the store ``open_store`` opens (module doc)."""

    def __init__(self, ledger: FleetLedger, open_store: Callable[[], QuotaStore], sync_s: float, stale_s: float,
                 group: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger, self.open_store, self.sync_s, self.stale_s, self.clock = ledger, open_store, sync_s, stale_s, clock
        self.group = group or secrets.token_hex(6)
        self.router = f"{self.group}.{secrets.token_hex(4)}"
        self.store: QuotaStore | None = None
        self.beats = 0
        self.written: dict[str, int] = {}
        self.heard: dict[str, tuple[float, float]] = {}
        """Another router -> (its heartbeat, when this router saw it grow)."""
        self.alive = 1
        """Groups alive at the last successful exchange, this one's included."""
        self.last_ok: float | None = None
        self.started = clock()
        self.failures = 0
        self.degraded = False
        """No exchange succeeded for ``stale_s``: the buckets refill at 1 / ``alive`` of their rate."""
        self._running: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self._errors_logged: set[str] = set()
        """Kinds of unexpected exchange errors logged already (each once)."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="kvmesh-quota-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    async def _loop(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(self.sync_s)

    def tick(self) -> None:
        """Start an exchange unless one runs; degrade when none succeeded for ``stale_s``."""
        now = self.clock()
        if now - (self.started if self.last_ok is None else self.last_ok) > self.stale_s:
            if not self.degraded:
                logger.warning("no exchange of tenants' token totals with the other routers for %gs: each tenant's "
                               "bucket refills here at 1/%d of its rate until one succeeds", self.stale_s, self.alive)
            self.degraded = True
            self.ledger.degrade(self.alive)
        if self._running is None or self._running.done():
            self._log_failed(self._running)
            self._running = asyncio.ensure_future(self.exchange())

    def _log_failed(self, done: asyncio.Future | None) -> None:
        """An exchange that ended in an unexpected error (not ``QuotaUnavailable``) logged, once per kind of
        error: no exchange succeeds meanwhile, so the split rate after ``stale_s`` covers it."""
        if done is None or done.cancelled() or (error := done.exception()) is None:
            return
        if type(error).__name__ not in self._errors_logged:
            self._errors_logged.add(type(error).__name__)
            logger.error("an exchange of tenants' token totals with the other routers failed: %r (each kind of "
                         "error logged once)", error)

    async def exchange(self) -> bool:
        """One exchange (module doc); whether it succeeded."""
        self.beats += 1
        totals = {b: t for b, t in self.ledger.taken.items() if self.written.get(b) != t}
        totals[HEARTBEAT] = self.beats
        try:
            rows = await asyncio.to_thread(self._exchange, totals, time.time())
        except QuotaUnavailable as e:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                logger.warning("tenants' token totals not exchanged with the other routers (%d failures so far): %s; "
                               "after %gs without an exchange each router refills at 1/%d of a tenant's rate",
                               self.failures, e, self.stale_s, self.alive)
            return False
        self.written.update(totals)
        self._heard(rows)
        others = [r for r in rows if r[1] != HEARTBEAT and not r[0].startswith(self.group + ".")]  # siblings: in
        self.ledger.absorb(others, self.clock(), first=self.last_ok is None)  # the shared memory already
        self.last_ok = self.clock()
        if self.degraded:
            logger.warning("tenants' token totals exchanged again: each bucket refills at its whole rate")
        self.degraded = False
        self.ledger.degrade(None)
        return True

    def _exchange(self, totals: dict[str, int], wall: float) -> list[tuple[str, str, float]]:
        if self.store is None:
            self.store = self.open_store()
        return self.store.exchange(self.router, totals, wall)

    def _heard(self, rows: list[tuple[str, str, float]]) -> None:
        now = self.clock()
        for router, bucket, total in rows:
            if bucket == HEARTBEAT:
                beat, _ = self.heard.get(router, (None, 0.0))
                if beat != total:
                    self.heard[router] = (total, now)
        groups = {r.split(".", 1)[0] for r, (_, at) in self.heard.items() if now - at <= self.stale_s}
        self.heard = {r: h for r, h in self.heard.items() if now - h[1] <= 10 * self.stale_s}
        self.alive = len(groups | {self.group})


def fleet_quota(gate: AdmissionGate | None, responses: ResponsesStoreConfig) -> QuotaSync | None:
    """Make ``gate``'s token buckets the fleet's (module doc): its ledger wrapped, the sync made (``start`` it); None
    when admission is off, no tenant has a limit or ``fleet_sync_s`` is 0."""
    if gate is None or not gate.config.fleet_sync_s:
        return None
    limits = gate.tenants.limits()
    if not limits and gate.tenants.default_limit is None:
        return None
    inner = gate.admission.ledger
    shared = inner if isinstance(inner, SharedLedger) else None  # a host's memory: its worker 0 charges the others'
    group = None if shared is None else shared.group
    ledger = FleetLedger(inner, applies=shared is None or shared.row == 0)
    for bucket, limit in limits.items():
        ledger.known(bucket, limit)
    gate.share(ledger)
    cfg = gate.config
    return QuotaSync(ledger, lambda: open_quota_store(responses, cfg.fleet_stale_s), cfg.fleet_sync_s,
                     cfg.fleet_stale_s, group)
