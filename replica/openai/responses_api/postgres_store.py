"""Stored responses in PostgreSQL: one database for routers on several hosts (sql_store.py holds the bounds).

psycopg 3 through a ``psycopg_pool.ConnectionPool`` (each connection checked when taken, so a database that
restarted costs no request an error). Writes take one transaction-scoped advisory lock (``WRITE_LOCK``): the routers'
writes run one at a time, as SQLite's do, so the bytes counted per tenant and the evictions never interleave;
waiting for it is bounded by ``lock_timeout``. The tables are created and migrated at open (migrations.py).

psycopg is the ``postgres`` extra (``pip install 'kvmesh[postgres]'``): imported only when a DSN is configured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kvmesh.replica.openai.config import FrontendConfig

from .migrations import POSTGRES, Run, migrate
from .sql_store import SQLResponseStore
from .store import StoreUnavailable

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger(__name__)

WRITE_LOCK = 0x6B766D65_73680001
"""The advisory lock key every kvmesh router's write takes (``kvmesh`` in ASCII, then this store's number)."""


class PostgresResponseStore(SQLResponseStore):
    """Stored responses (store.py) in PostgreSQL; thread-safe."""

    def __init__(self, config: FrontendConfig, dsn: str, pool_size: int = 4, busy_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(config, clock)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise StoreUnavailable("responses.dsn needs psycopg and psycopg_pool: pip install 'kvmesh[postgres]'") \
                from None
        self._errors = (psycopg.OperationalError,)
        self.busy_timeout_s = busy_timeout_s
        self._pool = ConnectionPool(dsn, min_size=1, max_size=pool_size, open=False, timeout=busy_timeout_s,
                                    check=ConnectionPool.check_connection, name="kvmesh-responses",
                                    kwargs={"connect_timeout": max(1, int(busy_timeout_s))})
        try:
            self._pool.open(wait=True, timeout=busy_timeout_s)
        except self._errors as e:
            self._pool.close()
            raise StoreUnavailable(f"PostgreSQL did not answer in {busy_timeout_s:g} s ({e}); check responses.dsn")\
                from None
        try:
            with self._write() as run:
                migrate(run, POSTGRES)
        except BaseException:
            self._pool.close()
            raise

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def _write(self) -> Iterator[Run]:
        with self._connection() as conn, conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = {int(self.busy_timeout_s * 1000)}")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            yield _runner(conn)

    @contextmanager
    def _read(self) -> Iterator[Run]:
        with self._connection() as conn, conn.transaction():
            yield _runner(conn)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection; the database's and the pool's failures as ``StoreUnavailable``."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except self._errors as e:  # the server down or restarting, no connection free in time (the pool's
            logger.warning("stored responses (PostgreSQL): %s", e)  # PoolTimeout is one), the lock not had
            raise StoreUnavailable(f"PostgreSQL: {type(e).__name__}") from None


def _runner(conn: psycopg.Connection) -> Run:
    """``Run`` on ``conn``: the portable statements' ``?`` placeholders as psycopg's ``%s``."""

    def run(sql: str, args: tuple) -> list[tuple]:
        cursor = conn.execute(sql.replace("?", "%s"), args)
        return cursor.fetchall() if cursor.description is not None else []

    return run
