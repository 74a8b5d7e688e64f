"""The stored responses' tables, versioned: kvmesh creates them and migrates an older database forward.

``kvmesh_schema`` holds one row per kvmesh component (``responses`` here) with the version its tables are at.
Opening a store runs, inside one write transaction (so two routers starting together migrate once), every
migration past that version, in order, then records the last. A database at a version newer than this kvmesh
knows is refused: an older router must not write rows a newer one reads differently.

Each migration is portable SQL with the column types of the dialect filled in (``Types``): SQLite and PostgreSQL
run the same statements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Run = Callable[[str, tuple], list[tuple]]
"""Runs one statement (``?`` placeholders) inside the open transaction; its rows (empty for a write)."""

COMPONENT = "responses"
"""This store's row in ``kvmesh_schema``."""


@dataclass(frozen=True, slots=True)
class Types:
    """The column types a dialect spells differently."""

    blob: str
    """Bytes (a response's JSON)."""
    real: str
    """A float (Unix seconds)."""
    int: str
    """A 64-bit integer (bytes)."""


SQLITE = Types(blob="BLOB", real="REAL", int="INTEGER")
POSTGRES = Types(blob="BYTEA", real="DOUBLE PRECISION", int="BIGINT")

MIGRATIONS: list[str] = [
    # 1: responses with their conversations and input items, each tenant's bytes, the notes of responses gone for a
    # bound
    """
    CREATE TABLE kvmesh_responses (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, used {real} NOT NULL,
                                   size {int} NOT NULL, response {blob} NOT NULL, conversation {blob} NOT NULL,
                                   input_items {blob} NOT NULL);
    CREATE INDEX kvmesh_responses_tenant_used ON kvmesh_responses (tenant, used);
    CREATE INDEX kvmesh_responses_used ON kvmesh_responses (used);
    CREATE TABLE kvmesh_response_bytes (tenant TEXT PRIMARY KEY, bytes {int} NOT NULL);
    CREATE TABLE kvmesh_expired_responses (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, gone {real} NOT NULL,
                                           reason TEXT NOT NULL);
    CREATE INDEX kvmesh_expired_responses_tenant_gone ON kvmesh_expired_responses (tenant, gone);
    CREATE INDEX kvmesh_expired_responses_gone ON kvmesh_expired_responses (gone);
    """,
]
"""Migration i + 1 takes the tables from version i to i + 1 (version 0: none); appended to, never edited."""

VERSION = len(MIGRATIONS)
"""The version this kvmesh writes."""


def migrate(run: Run, types: Types) -> int:
    """Bring the tables to ``VERSION`` (module doc) inside the caller's write transaction; the version found.
    ValueError: the database is newer than this kvmesh."""
    run("CREATE TABLE IF NOT EXISTS kvmesh_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)", ())
    rows = run("SELECT version FROM kvmesh_schema WHERE component = ?", (COMPONENT,))
    found = int(rows[0][0]) if rows else 0
    if found > VERSION:
        raise ValueError(f"the stored responses' tables are at version {found}, newer than this kvmesh knows "
                         f"({VERSION}); run a kvmesh at least as new as the one that wrote them")
    for script in MIGRATIONS[found:]:
        for statement in script.format(blob=types.blob, real=types.real, int=types.int).split(";"):
            if statement.strip():
                run(statement, ())
    if found < VERSION:
        run("DELETE FROM kvmesh_schema WHERE component = ?", (COMPONENT,))
        run("INSERT INTO kvmesh_schema (component, version) VALUES (?, ?)", (COMPONENT, VERSION))
    return found
