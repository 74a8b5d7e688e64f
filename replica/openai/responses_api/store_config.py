"""Where a router keeps its stored responses (``RouterConfig.responses``): a SQLite file, or PostgreSQL.

    one host     SQLite in a file (``path``; default ``responses.sqlite3`` in the state directory below): every
                 router process of the host opens it (WAL, a busy timeout), and a restarted router finds it
    several      PostgreSQL (``dsn``): every router of every host, one database; kvmesh creates and migrates its
                 tables (replica/openai/responses_api/migrations.py)

The state directory: ``$KVMESH_STATE_DIR``, else ``$XDG_STATE_HOME/kvmesh``, else ``~/.local/state/kvmesh``
(made with mode 0700: stored conversations are the tenants' private data).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR_ENV = "KVMESH_STATE_DIR"
"""The variable naming the state directory (module doc)."""
SQLITE_FILE = "responses.sqlite3"
"""The store's file name in the state directory."""


def state_directory() -> Path:
    """The state directory (module doc), not created."""
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "kvmesh"


@dataclass(frozen=True, slots=True)
class ResponsesStoreConfig:
    """Where the router's stored responses live (module doc); their bounds are the frontend's ``responses_*``."""

    path: str | None = None
    """SQLite file every router process of this host shares; None: responses.sqlite3 in the state directory
    ($KVMESH_STATE_DIR, else $XDG_STATE_HOME/kvmesh, else ~/.local/state/kvmesh). Unused when dsn is set."""
    dsn: str | None = field(default=None, repr=False, metadata={"cli": True})
    """PostgreSQL connection string (postgresql://USER:PASSWORD@HOST/DB) shared by routers on several hosts;
    needs the postgres extra (pip install 'kvmesh[postgres]'); None: the SQLite file."""
    pool_size: int = 4
    """Most connections one router process holds to PostgreSQL."""
    busy_timeout_s: float = 10.0
    """Seconds a write waits for another process's write (SQLite's lock, PostgreSQL's) or for a free connection."""

    def __post_init__(self) -> None:
        if self.dsn is not None and not self.dsn.startswith(("postgresql://", "postgres://")) and "=" not in self.dsn:
            raise ValueError("responses.dsn must be a PostgreSQL connection string: postgresql://USER:PASSWORD@HOST/DB "
                             "or 'host=... dbname=...'")
        if self.path is not None and not self.path.strip():
            raise ValueError("responses.path is empty; give a file, or leave it unset for the state directory's")
        if self.pool_size < 1:
            raise ValueError(f"responses.pool_size must be >= 1, got {self.pool_size}")
        if not self.busy_timeout_s > 0:
            raise ValueError(f"responses.busy_timeout_s must be positive seconds, got {self.busy_timeout_s}")

    def sqlite_path(self) -> Path:
        """The SQLite file: ``path``, else the state directory's."""
        return Path(self.path).expanduser() if self.path is not None else state_directory() / SQLITE_FILE

    def where(self) -> str:
        """Where the responses live, for a log line (never the DSN's password)."""
        if self.dsn is None:
            return f"SQLite {self.sqlite_path()}"
        return f"PostgreSQL {_without_password(self.dsn)}"


def _without_password(dsn: str) -> str:
    """``dsn`` with its password (URL form or ``password=``) replaced by ``***``."""
    from urllib.parse import urlsplit, urlunsplit

    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.password is None:
            return dsn
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))
    return " ".join("password=***" if word.startswith("password=") else word for word in dsn.split())
