"""``POST /reset_prefix_cache`` on the router: every replica resets (asked with the internal key), and the router's
index forgets their blocks through their events; a tenant's key is refused before any replica is asked."""

from __future__ import annotations

import httpx

from .conftest import ADMIN, fake_stats, wait_for
from .test_router_http import prompt

TENANT = {"Authorization": "Bearer tenant-key"}
INTERNAL = "cluster-internal-key"


def cached_everywhere(router, fakes) -> None:
    """Each fake caches a prompt of its own (sent to it directly), and the router's index learns it."""
    index = router.runtime.router.index
    for i, fake in enumerate(fakes):
        r = httpx.post(fake.info["url"] + "/v1/completions", json={"prompt": prompt(400 + i), "max_tokens": 2},
                       timeout=20)
        assert r.status_code == 200, r.text
        wait_for(lambda f=fake: index.num_blocks(f.name) > 0, what=f"BlockStored events from {fake.name}")


def test_the_admin_key_resets_every_replica_and_the_index_learns_it_from_their_events(fakes, start_router):
    router = start_router([f.spec for f in fakes], api_key="tenant-key", internal_key=INTERNAL)
    cached_everywhere(router, fakes)
    applied = router.runtime.router.events_applied
    r = httpx.post(router.url + "/reset_prefix_cache", headers=ADMIN, timeout=20)
    assert r.status_code == 200, r.text
    answers = r.json()["replicas"]
    assert set(answers) == {"a", "b"} and all(a["freed_blocks"] > 0 for a in answers.values()), answers
    index = router.runtime.router.index
    wait_for(lambda: index.num_blocks("a") == index.num_blocks("b") == 0, what="the index to empty")
    assert router.runtime.router.events_applied > applied  # it came as events, not by a side door
    for fake in fakes:
        assert fake_stats(fake)["auth_seen"][-1] == f"Bearer {INTERNAL}"


def test_a_tenant_key_cannot_reset_the_replicas(fakes, start_router):
    router = start_router([f.spec for f in fakes], api_key="tenant-key", internal_key=INTERNAL)
    cached_everywhere(router, fakes)
    held = {f.name: router.runtime.router.index.num_blocks(f.name) for f in fakes}
    for headers in ({}, TENANT, {"Authorization": f"Bearer {INTERNAL}"}):
        r = httpx.post(router.url + "/reset_prefix_cache", headers=headers, timeout=20)
        assert r.status_code in (401, 403) and "admin" in r.json()["error"]["message"], r.text
    for fake in fakes:
        assert "/reset_prefix_cache" not in str(fake_stats(fake))
    assert {f.name: router.runtime.router.index.num_blocks(f.name) for f in fakes} == held


def test_a_replica_that_cannot_be_reached_is_named_and_the_others_still_reset(fakes, start_router):
    from kvmesh.router.config import ReplicaSpec

    gone = ReplicaSpec("http://127.0.0.1:9", replica_id="gone")
    router = start_router([fakes[0].spec, gone], internal_key=INTERNAL)
    r = httpx.post(router.url + "/reset_prefix_cache", headers=ADMIN, timeout=20)
    assert r.status_code == 200, r.text
    answers = r.json()["replicas"]
    assert "freed_blocks" in answers["a"] and "could not be reached" in answers["gone"]["error"], answers
