"""Leases are bounded: a TTL cap, live leases per peer and in all, leased blocks; /kv/lease bodies bounded before
they are decoded, and the prompt hashed off the engine thread (real stories260K replica, real HTTP)."""

from __future__ import annotations

import random
import threading

import httpx
import pytest
from kvmesh.kvcache.hashing import RequestBlockHasher

from .kv_replicas import client, kv_replica, metric

CAPS = {"max_leases_per_peer": 2, "max_leases": 3, "max_lease_ttl_s": 5.0}


def fresh_prompt(seed: int, n: int = 428) -> list[int]:
    return [random.Random(seed).randrange(3, 500) for _ in range(n)]


@pytest.fixture(scope="module")
def holder(stories_path):
    with kv_replica(stories_path, lease_ttl_s=2.0, kv=CAPS) as a:
        yield a


@pytest.fixture
def ca(holder):
    with client(holder) as c:
        yield c
        assert metric(c, "kvmesh_kv_transfer_leases_active") == 0  # every test ends with no lease held


def cache(c, prompt) -> None:
    assert c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).status_code == 200


def lease(c, prompt, peer: str | None = None, **extra) -> httpx.Response:
    headers = {"x-kvmesh-replica-id": peer} if peer else {}
    return c.post("/kv/lease", json={"prompt_token_ids": prompt, **extra}, headers=headers)


def release_all(c, answers) -> None:
    for r in answers:
        if r.status_code == 200 and r.json()["lease_id"]:
            c.post("/kv/release", json={"lease_id": r.json()["lease_id"]}).raise_for_status()


def test_a_ttl_above_the_cap_is_clamped_to_it(ca):
    prompt = fresh_prompt(1, 40)
    cache(ca, prompt)
    r = lease(ca, prompt, ttl_s=3600)
    assert r.status_code == 200 and r.json()["expires_in_s"] == pytest.approx(5.0, abs=0.1)
    release_all(ca, [r])


def test_leases_past_the_per_peer_and_total_caps_are_429s_naming_the_cap(ca):
    prompt = fresh_prompt(2, 40)
    cache(ca, prompt)
    taken = [lease(ca, prompt, "x"), lease(ca, prompt, "x")]
    over_peer = lease(ca, prompt, "x")
    taken.append(lease(ca, prompt, "y"))
    over_total = lease(ca, prompt, "z")
    try:
        assert [r.status_code for r in taken] == [200, 200, 200]
        assert over_peer.status_code == 429 and "max_leases_per_peer" in over_peer.json()["error"]["message"]
        assert over_total.status_code == 429 and "kv_transfer.max_leases)" in over_total.json()["error"]["message"]
        assert over_peer.json()["error"]["code"] == 429
    finally:
        release_all(ca, taken)
    assert lease(ca, fresh_prompt(99, 40), "x").json()["lease_id"] == ""  # uncached: empty, never refused


def test_the_prefill_sides_lease_counts_toward_the_caps(ca):
    prompt = fresh_prompt(3, 40)
    cache(ca, prompt)
    taken = [lease(ca, prompt, "x"), lease(ca, prompt, "y"), lease(ca, prompt, "w")]  # the total cap: 3
    try:
        handle = ca.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {
            "do_remote_decode": True}}).json()["kv_transfer_params"]
        assert handle["remote_lease_id"] == "" and handle["remote_block_ids"] == []  # the decode side computes
    finally:
        release_all(ca, taken)
    handle = ca.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {
        "do_remote_decode": True}}).json()["kv_transfer_params"]
    assert handle["remote_lease_id"]
    ca.post("/kv/release", json={"lease_id": handle["remote_lease_id"]}).raise_for_status()


def test_leases_may_not_hold_more_than_the_blocks_fraction(stories_path):
    with kv_replica(stories_path, num_kv_blocks=40) as small, client(small) as c:  # 39 usable: 19 may be leased
        half = fresh_prompt(4, 19 * 16 + 1)
        cache(c, half)
        held = lease(c, half)
        assert held.status_code == 200 and len(held.json()["remote_block_ids"]) == 19
        one_more = fresh_prompt(5, 16 + 1)
        cache(c, one_more)
        over = lease(c, one_more)
        release_all(c, [held])
        assert over.status_code == 429 and "max_leased_blocks_fraction" in over.json()["error"]["message"]
        assert lease(c, one_more).status_code == 200  # room again once the first lease is released


def test_a_body_over_the_token_bound_is_a_413_before_it_is_decoded(holder, ca):
    limit = 12 * holder.llm.max_model_len + 4096
    r = ca.post("/kv/lease", content=b"x" * (limit + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


def test_more_token_ids_than_max_model_len_is_a_400(holder, ca):
    r = lease(ca, [7] * (holder.llm.max_model_len + 1))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_token_ids"
    assert "max_model_len" in r.json()["error"]["message"]


def test_the_engine_thread_never_hashes_a_lease_prompt(holder, ca, monkeypatch):
    prompt = fresh_prompt(5, holder.llm.max_model_len - 1)
    cache(ca, prompt)
    threads: list[str] = []
    extend = RequestBlockHasher.extend

    def recording(self, token_ids):
        threads.append(threading.current_thread().name)
        return extend(self, token_ids)

    monkeypatch.setattr(RequestBlockHasher, "extend", recording)
    r = lease(ca, prompt)
    monkeypatch.undo()
    release_all(ca, [r])
    assert r.status_code == 200 and len(r.json()["remote_block_ids"]) == (holder.llm.max_model_len - 1) // 16
    assert threads and "kvmesh-engine" not in threads


def test_a_released_lease_frees_its_peers_slot(ca):
    prompt = fresh_prompt(6, 40)
    cache(ca, prompt)
    first, second = lease(ca, prompt, "p"), lease(ca, prompt, "p")
    assert lease(ca, prompt, "p").status_code == 429
    release_all(ca, [first])
    third = lease(ca, prompt, "p")
    release_all(ca, [second, third])
    assert third.status_code == 200
