"""The store a router opens for its stored responses (store.py's ``ResponseStore``): PostgreSQL when the router's
``responses`` section names a DSN, else the SQLite file (store_config.py). Above the store's interface and both
databases, which never import it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .sqlite_store import SQLiteResponseStore
from .store import ResponseStore, StoreUnavailable

if TYPE_CHECKING:
    from kvmesh.replica.openai.config import FrontendConfig

    from .store_config import ResponsesStoreConfig


def open_store(where: ResponsesStoreConfig, bounds: FrontendConfig) -> ResponseStore:
    """The router's store: PostgreSQL when ``where.dsn`` is set (psycopg imported only then), else the SQLite file
    (its directory made private, 0700, when it is the state directory's)."""
    if where.dsn is not None:
        from .postgres_store import PostgresResponseStore

        return PostgresResponseStore(bounds, where.dsn, where.pool_size, where.busy_timeout_s)
    path = where.sqlite_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise StoreUnavailable(f"cannot make {path.parent} for the stored responses: {e.strerror}; set "
                               "router.responses.path (--responses-path) or KVMESH_STATE_DIR") from None
    return SQLiteResponseStore(bounds, str(path), busy_timeout_s=where.busy_timeout_s)
