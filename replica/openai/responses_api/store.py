"""Stored responses: per tenant, bounded in bytes and in age, shareable between processes.

A stored response keeps its Response object, its whole conversation (the chat messages a continuation renders
before its own input: earlier turns and this one's input and output) and its request's input items (what
``GET /v1/responses/{id}/input_items`` lists: input_items.py), so continuing it is one read and evicting
one response never breaks another's conversation. A row belongs to the tenant that stored it: reading, continuing
or deleting it with another tenant's credentials finds nothing (the caller answers 404, as for an id never stored).

Bounds (``FrontendConfig``'s ``responses_*`` fields), applied on every store:
- a response unused (not stored, read or continued) for ``responses_max_age_s`` is gone;
- a tenant's responses hold at most ``responses_max_bytes_per_tenant``: storing one more evicts that tenant's least
  recently used ones first; one larger than the bound alone is not stored (the answer says ``"store": false``);
- all tenants together hold at most ``responses_max_bytes``: the least recently used of any tenant go first.

The rows live in SQLite: in this process's memory (``path`` None), or in a file that several processes open
together (the router's workers: router/control/workers.py), each write one transaction under SQLite's lock.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import JsonValue

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, used REAL NOT NULL,
                                      size INTEGER NOT NULL, response BLOB NOT NULL, conversation BLOB NOT NULL,
                                      input_items BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS responses_tenant_used ON responses (tenant, used);
CREATE INDEX IF NOT EXISTS responses_used ON responses (used);
CREATE TABLE IF NOT EXISTS tenant_bytes (tenant TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
"""
SHARED_FILE = "responses.sqlite3"
"""The store's file name in ``shared_directory()``."""
LOCK_WAIT_S = 10.0
"""Seconds a write waits for another process's write to the same file."""


def shared_directory() -> Path:
    """A private directory (mode 0700) for a store that several processes share: in shared memory (/dev/shm) where
    the host has it, else the temporary directory; its creator removes it."""
    shm = Path("/dev/shm")
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="kvmesh-responses-", dir=where))


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: JSONObject
    """The Response object as it was answered."""
    conversation: list[JsonValue]
    """The chat messages up to and including this response's output."""
    input_items: list[JsonValue]
    """The request's input as OpenAI's items, each with its id (input_items.py)."""


class ResponseStore:
    """Stored responses (module doc); thread-safe, and process-safe on a file."""

    def __init__(self, config: FrontendConfig, path: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.max_bytes_per_tenant = config.responses_max_bytes_per_tenant
        self.max_bytes = config.responses_max_bytes
        self.max_age_s = config.responses_max_age_s
        self.path = path
        """The SQLite file several processes share; None: this process's memory."""
        self.clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path or ":memory:", timeout=LOCK_WAIT_S, isolation_level=None,
                                   check_same_thread=False)
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---------------------------------------------------------------- reads
    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """``tenant``'s response ``response_id`` (None: none of this tenant's, or too old); it counts as used."""
        now = self.clock()
        with self._lock:
            row = self._db.execute("SELECT response, conversation, input_items FROM responses WHERE id = ? AND "
                                   "tenant = ? AND "
                                   "used >= ?", (response_id, tenant, now - self.max_age_s)).fetchone()
            if row is None:
                return None
            self._db.execute("UPDATE responses SET used = ? WHERE id = ?", (now, response_id))
        return StoredResponse(*(msgspec.json.decode(blob) for blob in row))

    def tenant_bytes(self, tenant: str) -> int:
        """Bytes ``tenant``'s stored responses hold."""
        with self._lock:
            row = self._db.execute("SELECT bytes FROM tenant_bytes WHERE tenant = ?", (tenant,)).fetchone()
        return row[0] if row else 0

    def total_bytes(self) -> int:
        with self._lock:
            return self._total()

    # ---------------------------------------------------------------- writes
    def put(self, tenant: str, response: JSONObject, conversation: list[JsonValue],
            input_items: list[JsonValue] | None = None) -> bool:
        """Store ``response`` for ``tenant`` within the bounds (module doc); False: larger than a bound alone."""
        body, history = msgspec.json.encode(response), msgspec.json.encode(conversation)
        items = msgspec.json.encode(input_items or [])
        size = len(body) + len(history) + len(items)
        now = self.clock()
        if size > min(self.max_bytes_per_tenant, self.max_bytes):
            return False
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._drop("used < ?", (now - self.max_age_s,))
                self._evict("tenant = ?", (tenant,), self._tenant(tenant) + size - self.max_bytes_per_tenant)
                self._evict("1", (), self._total() + size - self.max_bytes)
                self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (response["id"], tenant, now, size, body, history, items))
                self._add(tenant, size)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return True

    def delete(self, tenant: str, response_id: str) -> bool:
        """Delete ``tenant``'s response ``response_id``; False: it had none of that id."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                dropped = self._drop("id = ? AND tenant = ?", (response_id, tenant))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return dropped > 0

    # ---------------------------------------------------------------- inside a transaction
    def _tenant(self, tenant: str) -> int:
        row = self._db.execute("SELECT bytes FROM tenant_bytes WHERE tenant = ?", (tenant,)).fetchone()
        return row[0] if row else 0

    def _total(self) -> int:
        return self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM tenant_bytes").fetchone()[0]

    def _add(self, tenant: str, size: int) -> None:
        self._db.execute("INSERT INTO tenant_bytes VALUES (?, ?) ON CONFLICT(tenant) DO UPDATE SET bytes = bytes + ?",
                         (tenant, size, size))
        self._db.execute("DELETE FROM tenant_bytes WHERE bytes <= 0")

    def _drop(self, where: str, args: tuple) -> int:
        """Delete the rows ``where`` says, their bytes off their tenants' totals; how many."""
        rows = self._db.execute(f"SELECT tenant, SUM(size), COUNT(*) FROM responses WHERE {where} GROUP BY tenant",
                                args).fetchall()
        if not rows:
            return 0
        self._db.execute(f"DELETE FROM responses WHERE {where}", args)
        for tenant, size, _ in rows:
            self._add(tenant, -size)
        return sum(count for _, _, count in rows)

    def _evict(self, where: str, args: tuple, excess: int) -> None:
        """Delete the least recently used rows ``where`` says until ``excess`` bytes are gone."""
        while excess > 0:
            rows = self._db.execute(f"SELECT id, size FROM responses WHERE {where} ORDER BY used, rowid LIMIT 64",
                                    args).fetchall()
            if not rows:
                return
            for response_id, size in rows:
                self._drop("id = ?", (response_id,))
                excess -= size
                if excess <= 0:
                    return
