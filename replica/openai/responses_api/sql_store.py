"""The bounds of store.py, written once in portable SQL: SQLite and PostgreSQL run the same statements.

A dialect (sqlite_store.py, postgres_store.py) gives two transactions: ``_write()``, which holds the database's
one write lock until it commits (SQLite's ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock), so the bytes counted
per tenant and the evictions of concurrent routers never interleave; and ``_read()``. Each yields a ``Run``
(migrations.py) and turns the driver's errors into ``StoreUnavailable``.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager

import msgspec
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import JsonValue

from .migrations import Run
from .store import TENANT_BYTES, TOTAL_BYTES, UNUSED, Expired, ResponseStore, StoredResponse

EVICT_BATCH = 64
"""Rows read per step while evicting the least recently used."""


class SQLResponseStore(ResponseStore):
    """Stored responses (store.py) over a dialect's transactions (module doc)."""

    def __init__(self, config: FrontendConfig, clock: Callable[[], float] = time.time) -> None:
        self.max_bytes_per_tenant = config.responses_max_bytes_per_tenant
        self.max_bytes = config.responses_max_bytes
        self.max_age_s = config.responses_max_age_s
        self.max_expired_per_tenant = config.responses_max_expired_per_tenant
        self.clock = clock

    @abstractmethod
    def _write(self) -> AbstractContextManager[Run]:
        """A transaction holding the write lock (module doc)."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[Run]:
        """A transaction for reads and single-row updates."""

    # ---------------------------------------------------------------- reads
    def get(self, tenant: str, response_id: str) -> StoredResponse | Expired | None:
        now = self.clock()
        with self._read() as run:
            rows = run("SELECT response, conversation, input_items, used FROM kvmesh_responses WHERE id = ? AND "
                       "tenant = ?", (response_id, tenant))
            if not rows:
                return self._expired(run, tenant, response_id)
            *blobs, used = rows[0]
            if used < now - self.max_age_s:  # aged out, not dropped yet (the next store drops it)
                return Expired(UNUSED, used + self.max_age_s)
            run("UPDATE kvmesh_responses SET used = ? WHERE id = ?", (now, response_id))
        return StoredResponse(*(msgspec.json.decode(bytes(blob)) for blob in blobs))

    def tenant_bytes(self, tenant: str) -> int:
        with self._read() as run:
            rows = run("SELECT bytes FROM kvmesh_response_bytes WHERE tenant = ?", (tenant,))
        return int(rows[0][0]) if rows else 0

    def total_bytes(self) -> int:
        with self._read() as run:
            return self._total(run)

    # ---------------------------------------------------------------- writes
    def put(self, tenant: str, response: JSONObject, conversation: list[JsonValue],
            input_items: list[JsonValue] | None = None) -> bool:
        body, history = msgspec.json.encode(response), msgspec.json.encode(conversation)
        items = msgspec.json.encode(input_items or [])
        size = len(body) + len(history) + len(items)
        if size > min(self.max_bytes_per_tenant, self.max_bytes):
            return False
        now = self.clock()
        with self._write() as run:
            self._drop(run, "used < ?", (now - self.max_age_s,), UNUSED, now)
            run("DELETE FROM kvmesh_expired_responses WHERE gone < ?", (now - self.max_age_s,))
            self._evict(run, "tenant = ?", (tenant,), self._tenant(run, tenant) + size - self.max_bytes_per_tenant,
                        TENANT_BYTES, now)
            self._evict(run, "1 = 1", (), self._total(run) + size - self.max_bytes, TOTAL_BYTES, now)
            self._drop(run, "id = ?", (response["id"],), None, now)
            run("INSERT INTO kvmesh_responses (id, tenant, used, size, response, conversation, input_items) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", (response["id"], tenant, now, size, body, history, items))
            self._add(run, tenant, size)
        return True

    def delete(self, tenant: str, response_id: str) -> bool | Expired:
        with self._write() as run:
            if self._drop(run, "id = ? AND tenant = ?", (response_id, tenant), None, self.clock()):
                return True
            gone = self._expired(run, tenant, response_id)
            if gone is not None:
                run("DELETE FROM kvmesh_expired_responses WHERE id = ?", (response_id,))
        return gone if gone is not None else False

    # ---------------------------------------------------------------- inside a transaction
    def _expired(self, run: Run, tenant: str, response_id: str) -> Expired | None:
        """The note ``tenant``'s response ``response_id`` left when it went for a bound, if any."""
        rows = run("SELECT reason, gone FROM kvmesh_expired_responses WHERE id = ? AND tenant = ?",
                   (response_id, tenant))
        return Expired(rows[0][0], rows[0][1]) if rows else None

    @staticmethod
    def _tenant(run: Run, tenant: str) -> int:
        rows = run("SELECT bytes FROM kvmesh_response_bytes WHERE tenant = ?", (tenant,))
        return int(rows[0][0]) if rows else 0

    @staticmethod
    def _total(run: Run) -> int:
        return int(run("SELECT COALESCE(SUM(bytes), 0) FROM kvmesh_response_bytes", ())[0][0])

    @staticmethod
    def _add(run: Run, tenant: str, size: int) -> None:
        run("INSERT INTO kvmesh_response_bytes (tenant, bytes) VALUES (?, ?) ON CONFLICT (tenant) "
            "DO UPDATE SET bytes = kvmesh_response_bytes.bytes + excluded.bytes", (tenant, size))
        run("DELETE FROM kvmesh_response_bytes WHERE bytes <= 0", ())

    def _drop(self, run: Run, where: str, args: tuple, reason: str | None, now: float) -> int:
        """Delete the rows ``where`` says, their bytes off their tenants' totals, a note for each when they go for
        a bound (``reason``); how many."""
        rows = run(f"SELECT tenant, SUM(size), COUNT(*) FROM kvmesh_responses WHERE {where} GROUP BY tenant", args)
        if not rows:
            return 0
        if reason is not None:
            run("INSERT INTO kvmesh_expired_responses (id, tenant, gone, reason) "
                f"SELECT id, tenant, ?, ? FROM kvmesh_responses WHERE {where} ON CONFLICT (id) DO NOTHING",
                (now, reason, *args))
        run(f"DELETE FROM kvmesh_responses WHERE {where}", args)
        for tenant, size, _ in rows:
            self._add(run, tenant, -int(size))
            if reason is not None:
                self._trim_notes(run, tenant)
        return sum(int(count) for _, _, count in rows)

    def _trim_notes(self, run: Run, tenant: str) -> None:
        """Keep ``tenant``'s newest ``max_expired_per_tenant`` notes."""
        rows = run("SELECT gone FROM kvmesh_expired_responses WHERE tenant = ? ORDER BY gone DESC, id DESC "
                   "LIMIT 1 OFFSET ?", (tenant, self.max_expired_per_tenant))
        if rows:
            run("DELETE FROM kvmesh_expired_responses WHERE tenant = ? AND gone <= ? AND id NOT IN (SELECT id FROM "
                "kvmesh_expired_responses WHERE tenant = ? ORDER BY gone DESC, id DESC LIMIT ?)",
                (tenant, rows[0][0], tenant, self.max_expired_per_tenant))

    def _evict(self, run: Run, where: str, args: tuple, excess: int, reason: str, now: float) -> None:
        """Delete the least recently used rows ``where`` says until ``excess`` bytes are gone."""
        while excess > 0:
            rows = run(f"SELECT id, size FROM kvmesh_responses WHERE {where} ORDER BY used, id LIMIT {EVICT_BATCH}",
                       args)
            if not rows:
                return
            for response_id, size in rows:
                self._drop(run, "id = ?", (response_id,), reason, now)
                excess -= int(size)
                if excess <= 0:
                    return
