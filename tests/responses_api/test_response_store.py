"""Stored responses (replica/openai/responses_api/store.py) on both databases, SQLite and a real PostgreSQL: a
tenant's only, bounded per tenant, in all and in idle age, least recently used evicted first, an expired one told
to its owner as expired (to anyone else as never stored), one file shared by several processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore
from kvmesh.replica.openai.responses_api.store import Expired, StoredResponse


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def response(response_id: str, text: str = "x" * 100) -> dict:
    return {"id": response_id, "object": "response", "output": [{"type": "message", "content": [{"text": text}]}]}


@pytest.fixture(params=["sqlite", "postgres"])
def store(request):
    """``store(clock=None, **bounds)``: a new empty store on the parameter's database."""
    made = []

    def make(clock: Clock | None = None, **bounds):
        config, clock = FrontendConfig(**bounds), clock or Clock()
        if request.param == "sqlite":
            made.append(SQLiteResponseStore(config, clock=clock))
        else:
            from kvmesh.replica.openai.responses_api.postgres_store import PostgresResponseStore

            dsn = request.getfixturevalue("postgres").new_database()
            made.append(PostgresResponseStore(config, dsn, clock=clock))
        made[-1].clock = clock
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_response_is_read_back_by_its_tenant_only(store):
    s = store()
    assert s.put("ann", response("resp_1"), [{"role": "user", "content": "hi"}])
    got = s.get("ann", "resp_1")
    assert got.response["id"] == "resp_1" and got.conversation == [{"role": "user", "content": "hi"}]
    assert s.get("bob", "resp_1") is None
    assert not s.delete("bob", "resp_1") and s.get("ann", "resp_1") is not None
    assert s.delete("ann", "resp_1") and s.get("ann", "resp_1") is None
    assert s.tenant_bytes("ann") == 0 and s.total_bytes() == 0


def test_a_tenant_over_its_bound_loses_its_least_recently_used_first(store):
    s = store(responses_max_bytes_per_tenant=800)
    for i in range(4):
        assert s.put("ann", response(f"resp_{i}"), [])
    size = s.tenant_bytes("ann") // 4
    assert size * 4 <= 800 < size * 5
    s.clock.now += 1
    s.get("ann", "resp_0")  # read: now the most recently used
    s.put("bob", response("resp_b"), [])
    s.put("ann", response("resp_4"), [])
    kept = [isinstance(s.get("ann", f"resp_{i}"), StoredResponse) for i in range(5)]
    assert kept == [True, False, True, True, True]
    assert s.get("ann", "resp_1") == Expired("tenant_bytes", s.clock.now) and s.get("bob", "resp_1") is None
    assert s.tenant_bytes("ann") <= 800 and s.get("bob", "resp_b") is not None


def test_the_bound_over_all_tenants_evicts_the_least_recently_used_of_any(store):
    clock = Clock()
    s = store(clock, responses_max_bytes=800)
    for i, tenant in enumerate(["ann", "bob", "ann", "bob"]):
        clock.now += 1
        s.put(tenant, response(f"resp_{i}"), [])
    clock.now += 1
    s.put("cat", response("resp_c"), [])
    assert s.get("ann", "resp_0") == Expired("total_bytes", clock.now) and s.get("cat", "resp_0") is None
    assert isinstance(s.get("bob", "resp_1"), StoredResponse)
    assert s.total_bytes() <= 800


def test_a_response_larger_than_a_bound_alone_is_not_stored(store):
    s = store(responses_max_bytes_per_tenant=300)
    assert not s.put("ann", response("resp_big", "y" * 400), [])
    assert s.get("ann", "resp_big") is None and s.tenant_bytes("ann") == 0


def test_a_response_unused_for_the_max_age_is_gone_and_use_keeps_it(store):
    clock = Clock()
    s = store(clock, responses_max_age_s=60)
    s.put("ann", response("resp_o"), [])
    s.put("ann", response("resp_u"), [])
    clock.now += 50
    assert s.get("ann", "resp_u") is not None
    clock.now += 20
    assert s.get("ann", "resp_o") == Expired("unused", 1060.0) and s.get("bob", "resp_o") is None
    assert isinstance(s.get("ann", "resp_u"), StoredResponse)
    one = s.tenant_bytes("ann") // 2
    s.put("ann", response("resp_n"), [])  # a store drops what aged out
    assert s.tenant_bytes("ann") == 2 * one
    clock.now += 61
    s.put("bob", response("resp_b"), [])
    assert s.tenant_bytes("ann") == 0


def test_a_flood_keeps_every_tenant_within_its_bound(store):
    s = store(responses_max_bytes_per_tenant=5000, responses_max_bytes=8000)
    for i in range(200):
        s.put(f"t{i % 3}", response(f"resp_{i}", "z" * (i % 200)), [{"role": "user", "content": "w" * (i % 50)}])
        assert all(s.tenant_bytes(f"t{t}") <= 5000 for t in range(3)) and s.total_bytes() <= 8000
    assert isinstance(s.get("t1", "resp_199"), StoredResponse)  # the newest stays


def test_an_owner_deleting_an_expired_response_is_told_it_expired_once(store):
    clock = Clock()
    s = store(clock, responses_max_age_s=60)
    s.put("ann", response("resp_o"), [])
    clock.now += 61
    s.put("ann", response("resp_n"), [])  # drops resp_o, leaving its note
    assert s.delete("bob", "resp_o") is False
    assert s.delete("ann", "resp_o") == Expired("unused", clock.now)
    assert s.get("ann", "resp_o") is None and s.delete("ann", "resp_o") is False


def test_the_notes_of_expired_responses_are_bounded_per_tenant_and_in_age(store):
    clock = Clock()
    s = store(clock, responses_max_bytes_per_tenant=400, responses_max_expired_per_tenant=3, responses_max_age_s=60)
    for i in range(8):
        clock.now += 1
        s.put("ann", response(f"resp_{i}"), [])
    expired = [isinstance(s.get("ann", f"resp_{i}"), Expired) for i in range(8)]
    assert sum(expired) == 3 and expired[:3] == [False] * 3  # the newest notes kept, the oldest forgotten
    clock.now += 61
    s.put("bob", response("resp_b"), [])
    assert not any(isinstance(s.get("ann", f"resp_{i}"), Expired) for i in range(5))  # notes age out too


def test_a_deleted_response_leaves_no_note(store):
    s = store()
    s.put("ann", response("resp_d"), [])
    assert s.delete("ann", "resp_d") is True
    assert s.get("ann", "resp_d") is None


def test_processes_sharing_the_file_see_each_others_responses(tmp_path):
    path = tmp_path / "responses.sqlite3"
    s = SQLiteResponseStore(FrontendConfig(), str(path))
    s.put("ann", response("resp_parent"), [{"role": "user", "content": "hi"}])
    other = textwrap.dedent(f"""
        from kvmesh.replica.openai.config import FrontendConfig
        from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore
        s = SQLiteResponseStore(FrontendConfig(), {str(path)!r})
        assert s.get("ann", "resp_parent") is not None and s.get("bob", "resp_parent") is None
        s.put("ann", {{"id": "resp_child", "output": []}}, [])
    """)
    subprocess.run([sys.executable, "-c", other], check=True, timeout=60)
    assert isinstance(s.get("ann", "resp_child"), StoredResponse)
    assert (path.stat().st_mode & 0o777) == 0o600  # the tenants' conversations: the owner's only


def test_a_reopened_file_keeps_every_response(tmp_path):
    path = str(tmp_path / "responses.sqlite3")
    s = SQLiteResponseStore(FrontendConfig(), path)
    s.put("ann", response("resp_kept"), [{"role": "user", "content": "hi"}])
    s.close()
    again = SQLiteResponseStore(FrontendConfig(), path)
    assert again.get("ann", "resp_kept").conversation == [{"role": "user", "content": "hi"}]
