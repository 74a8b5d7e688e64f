"""Stored responses in SQLite: in this process's memory (a replica's own), or in a file on disk that every router
process of a host opens together (sql_store.py holds the bounds).

On a file: WAL journal (readers never wait for the writer), a busy timeout (a write waits for another process's
write), each write one ``BEGIN IMMEDIATE`` transaction; the file is made private (0600) before SQLite opens it.
A router that restarts opens the same file and finds every response it stored.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kvmesh.replica.openai.config import FrontendConfig

from .migrations import SQLITE, Run, migrate
from .sql_store import SQLResponseStore
from .store import StoreUnavailable

logger = logging.getLogger(__name__)


class SQLiteResponseStore(SQLResponseStore):
    """Stored responses (store.py) in SQLite; thread-safe, and process-safe on a file."""

    def __init__(self, config: FrontendConfig, path: str | None = None, clock: Callable[[], float] = time.time,
                 busy_timeout_s: float = 10.0) -> None:
        super().__init__(config, clock)
        self.path = path
        """The SQLite file several processes share; None: this process's memory."""
        self._lock = threading.Lock()
        try:
            if path is not None and not os.path.exists(path):
                os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
            self._db = sqlite3.connect(path or ":memory:", timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
            if path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        except (OSError, sqlite3.DatabaseError) as e:
            raise StoreUnavailable(f"cannot open the stored responses' file {path}: {e}") from None
        with self._write() as run:
            migrate(run, SQLITE)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _run(self, sql: str, args: tuple) -> list[tuple]:
        return self._db.execute(sql, args).fetchall()

    @contextmanager
    def _write(self) -> Iterator[Run]:
        with self._lock, _unavailable(self.path):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._run
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[Run]:
        with self._lock, _unavailable(self.path):
            yield self._run


@contextmanager
def _unavailable(path: str | None) -> Iterator[None]:
    """SQLite's failures (locked past the busy timeout, a disk error, a file that is not a database) as
    ``StoreUnavailable``; a programming error stays what it is."""
    try:
        yield
    except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
        raise
    except sqlite3.DatabaseError as e:
        logger.warning("stored responses (%s): %s", path or "memory", e)
        raise StoreUnavailable(f"SQLite: {e}") from None
