"""The stored responses' databases (replica/openai/responses_api/): where the router's section puts them, kvmesh's
own schema versions, what a wrong or absent database says, and routers writing one database at once."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.responses_api.migrations import VERSION
from kvmesh.replica.openai.responses_api.open_store import open_store
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore
from kvmesh.replica.openai.responses_api.store import StoreUnavailable
from kvmesh.replica.openai.responses_api.store_config import STATE_DIR_ENV, ResponsesStoreConfig


def test_the_default_file_is_in_the_state_directory_made_private(tmp_path, monkeypatch):
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "state"))
    store = open_store(ResponsesStoreConfig(), FrontendConfig())
    store.put("ann", {"id": "resp_1", "output": []}, [])
    store.close()
    assert (tmp_path / "state" / "responses.sqlite3").is_file()
    assert ((tmp_path / "state").stat().st_mode & 0o777) == 0o700
    assert ResponsesStoreConfig().where() == f"SQLite {tmp_path / 'state' / 'responses.sqlite3'}"


def test_a_file_that_cannot_be_made_is_a_clear_error():
    with pytest.raises(StoreUnavailable, match="--responses-path"):
        open_store(ResponsesStoreConfig(path="/proc/kvmesh/responses.sqlite3"), FrontendConfig())


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    path = tmp_path / "responses.sqlite3"
    path.write_bytes(b"not a database at all, " * 100)
    with pytest.raises(StoreUnavailable, match="not a database"):
        SQLiteResponseStore(FrontendConfig(), str(path))


@pytest.mark.parametrize("dsn", ["mysql://x", "nonsense", ""])
def test_a_dsn_that_is_not_postgresqls_is_refused_in_the_config(dsn):
    with pytest.raises(ValueError, match="responses.dsn"):
        ResponsesStoreConfig(dsn=dsn)


def test_the_dsns_password_never_reaches_a_log_line():
    assert "s3cret" not in ResponsesStoreConfig(dsn="postgresql://kv:s3cret@db.example/kv").where()
    assert "s3cret" not in ResponsesStoreConfig(dsn="host=db password=s3cret dbname=kv").where()
    assert "s3cret" not in repr(ResponsesStoreConfig(dsn="postgresql://kv:s3cret@db.example/kv"))


def test_a_postgresql_that_does_not_answer_is_a_clear_error_at_start(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is the postgres extra, in the dev dependencies")
    dsn = f"postgresql://postgres@/postgres?host={tmp_path}"  # no server on that socket
    with pytest.raises(StoreUnavailable, match="check responses.dsn"):
        open_store(ResponsesStoreConfig(dsn=dsn, busy_timeout_s=1.0), FrontendConfig())


def test_a_sqlite_file_of_a_newer_kvmesh_is_refused(tmp_path):
    path = str(tmp_path / "responses.sqlite3")
    SQLiteResponseStore(FrontendConfig(), path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE kvmesh_schema SET version = ?", (VERSION + 1,))
    with pytest.raises(ValueError, match="newer than this kvmesh"):
        SQLiteResponseStore(FrontendConfig(), path)


def test_a_postgresql_database_is_migrated_once_and_a_newer_one_refused(postgres):
    import psycopg
    from kvmesh.replica.openai.responses_api.postgres_store import PostgresResponseStore

    dsn = postgres.new_database()
    first, second = PostgresResponseStore(FrontendConfig(), dsn), PostgresResponseStore(FrontendConfig(), dsn)
    first.put("ann", {"id": "resp_1", "output": []}, [])
    assert second.get("ann", "resp_1") is not None  # one database: the other router's row
    first.close(), second.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT component, version FROM kvmesh_schema").fetchall() == [("responses", VERSION)]
        conn.execute("UPDATE kvmesh_schema SET version = %s", (VERSION + 1,))
    with pytest.raises(ValueError, match="newer than this kvmesh"):
        PostgresResponseStore(FrontendConfig(), dsn)


def test_routers_writing_one_postgresql_at_once_keep_every_bound_and_every_count(postgres):
    import psycopg
    from kvmesh.replica.openai.responses_api.postgres_store import PostgresResponseStore

    dsn, bounds = postgres.new_database(), FrontendConfig(responses_max_bytes_per_tenant=3000, responses_max_bytes=5000)
    routers = [PostgresResponseStore(bounds, dsn) for _ in range(3)]
    failures: list[BaseException] = []

    def write(router: PostgresResponseStore, index: int) -> None:
        try:
            for i in range(40):
                router.put(f"t{i % 2}", {"id": f"resp_{index}_{i}", "output": "x" * (i * 7 % 300)}, [])
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=write, args=(r, i)) for i, r in enumerate(routers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures
    with psycopg.connect(dsn) as conn:
        held = dict(conn.execute("SELECT tenant, SUM(size) FROM kvmesh_responses GROUP BY tenant").fetchall())
        counted = dict(conn.execute("SELECT tenant, bytes FROM kvmesh_response_bytes").fetchall())
    assert {t: int(b) for t, b in held.items()} == counted  # no interleaved eviction lost or doubled a byte
    assert all(b <= 3000 for b in counted.values()) and sum(counted.values()) <= 5000
    for r in routers:
        r.close()
