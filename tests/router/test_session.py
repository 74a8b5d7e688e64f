"""Session affinity: soft pins released by the policy's cost, with a TTL and a size bound."""

from __future__ import annotations

import pytest
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.session import SessionConfig, SessionTable

BS = 16


def prompt(seed: int, n_blocks: int = 8) -> list[int]:
    return [3 + (seed * 13 + i) % 250 for i in range(n_blocks * BS)] + [1]


def router(**kw) -> KVRouter:
    r = KVRouter(block_size=BS, policy=get_policy("cache_aware", block_size=BS), predict_ttl_s=0, **kw)
    for rid in ("r0", "r1", "r2", "r3"):
        r.add_replica(rid)
    return r


def test_session_stays_on_its_replica_when_the_cache_says_nothing():
    r = router()
    first = r.route(prompt(1), session_id="chat-1", now=0.0).replica_id
    # Unrelated prompts (no shared prefix, no predictions): without the pin they rotate over idle replicas.
    picks = {r.route(prompt(i), session_id="chat-1", now=float(i)).replica_id for i in range(2, 8)}
    assert picks == {first}
    assert r.route(prompt(9), now=9.0).receipt.reason != "session"


def test_session_reason_only_when_the_pin_changed_the_choice():
    r = router()
    r.route(prompt(1), session_id="s", now=0.0)
    receipt = r.route(prompt(2), session_id="s", now=1.0).receipt
    assert receipt.reason == "session" and receipt.session_id == "s"


def test_saturated_replica_releases_its_session():
    r = router(sessions=SessionConfig(ttl_s=60))
    home = r.route(prompt(1), session_id="s", now=0.0).replica_id
    r.loads.loads[home].queued_prefill_tokens = 50_000  # cost far beyond session_slack_tokens
    moved = r.route(prompt(2), session_id="s", now=1.0)
    assert moved.replica_id != home and moved.receipt.reason != "session"
    r.loads.loads[home].queued_prefill_tokens = 0
    assert r.route(prompt(3), session_id="s", now=2.0).replica_id == moved.replica_id  # re-pinned


def test_pin_expires_after_its_ttl():
    table = SessionTable(SessionConfig(ttl_s=10))
    table.pin("s", "r1", now=0.0)
    assert table.get("s", now=9.9) == "r1"
    assert table.get("s", now=10.0) is None and len(table) == 0


def test_table_drops_least_recently_used_beyond_max_sessions():
    table = SessionTable(SessionConfig(max_sessions=2))
    table.pin("a", "r0", 0.0)
    table.pin("b", "r1", 0.0)
    table.pin("a", "r0", 1.0)  # refreshes a
    table.pin("c", "r2", 2.0)
    assert table.get("b", 3.0) is None and table.get("a", 3.0) == "r0" and table.get("c", 3.0) == "r2"


def test_unhealthy_or_removed_replica_loses_its_sessions():
    r = router()
    home = r.route(prompt(1), session_id="s", now=0.0).replica_id
    r.set_healthy(r.replicas.get(home), False)
    assert r.route(prompt(2), session_id="s", now=1.0).replica_id != home
    r.set_healthy(r.replicas.get(home), True)
    r.remove_replica(r.sessions.get("s", 2.0))
    assert r.sessions.get("s", 2.0) is None


def test_bad_session_config_is_rejected():
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        SessionConfig(ttl_s=0)
    with pytest.raises(ValueError, match="max_sessions must be >= 1"):
        SessionConfig(max_sessions=0)
