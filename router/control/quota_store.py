"""Where the routers of a fleet leave their tenants' token totals for each other: one table, a row per router and
bucket, in the database the stored responses use (``router.responses``: a SQLite file of the state directory for
the routers of one host, PostgreSQL for several hosts).

    kvmesh_quota_totals  (router, bucket) -> total tokens that router took from the bucket since it started,
                         and the writer's wall time (only to forget routers gone for ``FORGET_S``)
                         bucket '' is the router's heartbeat: its count of exchanges

``exchange`` is one transaction: this router's changed totals and its heartbeat written (each router writes only
its own rows: no lock between routers), every other router's rows read. The SQLite file is ``quota.sqlite3`` beside
``responses.sqlite3`` (its own file: a quota exchange never waits behind a response being stored).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Protocol

from kvmesh.replica.openai.responses_api.store_config import ResponsesStoreConfig

QUOTA_FILE = "quota.sqlite3"
"""The SQLite file's name, beside the stored responses' file."""
FORGET_S = 3600.0
"""Rows of a router that wrote none for this long are deleted (it is gone; its totals were counted long ago)."""
HEARTBEAT = ""
"""The bucket name of a router's heartbeat row."""
_CREATE = ("CREATE TABLE IF NOT EXISTS kvmesh_quota_totals (router TEXT NOT NULL, bucket TEXT NOT NULL, "
           "total DOUBLE PRECISION NOT NULL, written_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (router, bucket))")
_UPSERT = ("INSERT INTO kvmesh_quota_totals (router, bucket, total, written_at) VALUES (?, ?, ?, ?) "
           "ON CONFLICT (router, bucket) DO UPDATE SET total = excluded.total, written_at = excluded.written_at")
_FORGET = "DELETE FROM kvmesh_quota_totals WHERE written_at < ? AND router <> ?"
_OTHERS = "SELECT router, bucket, total FROM kvmesh_quota_totals WHERE router <> ?"


class QuotaUnavailable(Exception):
    """The database did not answer (down, locked past the timeout, not a database)."""


class QuotaStore(Protocol):
    def exchange(self, router: str, totals: dict[str, int], wall: float) -> list[tuple[str, str, float]]:
        """Write ``router``'s ``totals`` (bucket -> tokens; the heartbeat's among them), read the other routers'
        ``(router, bucket, total)``; QuotaUnavailable when the database does not answer."""
        ...

    def close(self) -> None: ...


class SQLiteQuotaStore:
    """The table in a SQLite file every router process of a host opens (WAL, a short busy timeout)."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not path.exists():
                os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
            self._db = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # no fsync per exchange (a power cut loses 0.1 s)
            self._db.execute(_CREATE)
        except (OSError, sqlite3.DatabaseError) as e:
            raise QuotaUnavailable(f"cannot open the quota file {path}: {e}") from None

    def exchange(self, router: str, totals: dict[str, int], wall: float) -> list[tuple[str, str, float]]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(_UPSERT, [(router, b, t, wall) for b, t in totals.items()])
                    self._db.execute(_FORGET, (wall - FORGET_S, router))
                    rows = self._db.execute(_OTHERS, (router,)).fetchall()
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.DatabaseError as e:
                raise QuotaUnavailable(f"SQLite {self.path}: {e}") from None
        return rows

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresQuotaStore:
    """The table in PostgreSQL (the responses' DSN): one short transaction per exchange on a connection of its own."""

    def __init__(self, dsn: str, timeout_s: float) -> None:
        try:
            import psycopg
        except ImportError:
            raise QuotaUnavailable("responses.dsn needs psycopg: pip install 'kvmesh[postgres]'") from None
        self._psycopg, self._dsn, self._timeout_s = psycopg, dsn, timeout_s
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        with self._lock:
            self._run(lambda conn: conn.execute(_CREATE))

    def _run(self, work):
        """``work(connection)`` in one transaction, (re)connecting first; failures as QuotaUnavailable."""
        pg = self._psycopg
        try:
            if self._conn is None or self._conn.closed:
                self._conn = pg.connect(self._dsn, connect_timeout=max(1, int(self._timeout_s)), autocommit=True)
            with self._conn.transaction():
                self._conn.execute(f"SET LOCAL statement_timeout = {int(self._timeout_s * 1000)}")
                return work(self._conn)
        except pg.Error as e:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            raise QuotaUnavailable(f"PostgreSQL: {type(e).__name__}") from None

    def exchange(self, router: str, totals: dict[str, int], wall: float) -> list[tuple[str, str, float]]:
        def work(conn) -> list[tuple[str, str, float]]:
            with conn.cursor() as cur:
                cur.executemany(_UPSERT.replace("?", "%s"), [(router, b, t, wall) for b, t in totals.items()])
                cur.execute(_FORGET.replace("?", "%s"), (wall - FORGET_S, router))
                cur.execute(_OTHERS.replace("?", "%s"), (router,))
                return [tuple(row) for row in cur.fetchall()]

        with self._lock:
            return self._run(work)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()


def open_quota_store(config: ResponsesStoreConfig, timeout_s: float) -> QuotaStore:
    """The table where ``config`` keeps stored responses: PostgreSQL at its DSN, else ``quota.sqlite3`` beside its
    SQLite file. QuotaUnavailable when it cannot be opened (the caller degrades as for a failed exchange)."""
    if config.dsn is not None:
        return PostgresQuotaStore(config.dsn, timeout_s)
    return SQLiteQuotaStore(config.sqlite_path().with_name(QUOTA_FILE), timeout_s)
