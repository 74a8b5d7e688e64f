"""The replica set is changed only with the admin key: tenants cannot register a replica."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.router.config import RouterConfig

from .conftest import BLOCK_SIZE, fake_stats
from .test_router_http import prompt

TENANT = {"Authorization": "Bearer tenant-key"}
ADMIN = {"Authorization": "Bearer admin-key"}


def _register(router, spec, name, headers):
    body = {"url": spec.url, "events": spec.events, "replay": spec.replay, "id": name}
    return httpx.post(router.url + "/replicas", json=body, headers=headers, timeout=10)


def test_hijack_by_registering_a_fake_replica_fails(fakes, start_router):
    legit, hijacker = fakes  # "b" plays the attacker's server: it records every request it receives
    router = start_router([legit.spec], api_key="tenant-key", upstream={"replica_api_key": "replica-secret"},
                          admin_key=None)
    for headers in ({}, TENANT, {"Authorization": "Bearer replica-secret"}):
        r = _register(router, hijacker.spec, "evil", headers)
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert "admin" in r.json()["error"]["message"]
    assert httpx.delete(router.url + "/replicas/a", headers=TENANT).status_code == 403
    for i in range(8):
        r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(70 + i), "max_tokens": 2},
                       headers=TENANT, timeout=20)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "a"
    seen = fake_stats(hijacker)["auth_seen"]
    assert seen == [] and set(fake_stats(legit)["auth_seen"]) == {"Bearer replica-secret"}
    assert {r.id for r in router.runtime.replicas} == {"a"}


def test_admin_endpoints_are_closed_when_no_admin_key_is_configured(fakes, start_router):
    router = start_router([], admin_key=None)  # the default: no API key, no admin key
    r = _register(router, fakes[0].spec, "a", {})
    assert r.status_code == 403 and "disabled" in r.json()["error"]["message"]
    assert len(router.runtime.replicas) == 0
    r = httpx.get(router.url + "/replicas")  # reading the set too: it names the replicas' URLs
    assert r.status_code == 403 and "disabled" in r.json()["error"]["message"]


def test_admin_key_registers_and_removes_while_the_api_key_cannot(fakes, start_router):
    router = start_router([], api_key="tenant-key", admin_key="admin-key")
    assert _register(router, fakes[0].spec, "a", TENANT).status_code == 403
    r = _register(router, fakes[0].spec, "a", ADMIN)
    assert r.status_code == 200 and r.json() == {"id": "a", "healthy": True}
    assert httpx.get(router.url + "/v1/models", headers=ADMIN).status_code == 200  # the admin reads the cards (roots)
    assert httpx.post(router.url + "/v1/completions", headers=ADMIN,  # but the admin key is not a tenant's
                      json={"model": "kvmesh", "prompt": "hi"}).status_code == 401
    assert httpx.get(router.url + "/replicas", headers=TENANT).status_code == 403  # the tenants' key sees no URLs
    assert httpx.get(router.url + "/replicas", headers=ADMIN).json()["replicas"][0]["id"] == "a"
    assert httpx.delete(router.url + "/replicas/a", headers=ADMIN).json() == {"id": "a", "removed": True}


@pytest.mark.parametrize("body", [
    b"{not json", b"[]", b'{"url": 5}', b'{"url": "ftp://x"}', b'{"url": "http://x", "events": "nope"}',
    b'{"url": "http://x", "extra": 1}', b'{"events": "tcp://x:1"}', b'{"url": "http://x", "id": ["a"]}',
])
def test_bad_registration_bodies_are_400(start_router, body):
    router = start_router([], admin_key="admin-key")
    r = httpx.post(router.url + "/replicas", content=body, headers={**ADMIN, "content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400 and len(router.runtime.replicas) == 0


def test_admin_key_must_differ_from_the_api_key():
    with pytest.raises(ValueError, match="admin_key equals api_key"):
        RouterConfig(block_size=BLOCK_SIZE, api_key="same-key", admin_key="same-key")


def test_refusals_are_counted_as_4xx(start_router):
    router = start_router([], api_key="tenant-key")
    reg = router.runtime.metrics.registry
    before = reg.get_sample_value("kvmesh_router_requests_total", {"status": "4xx"}) or 0
    assert httpx.post(router.url + "/v1/completions", json={"prompt": "hi"}).status_code == 401
    assert httpx.post(router.url + "/replicas", json={"url": "http://x"}, headers=TENANT).status_code == 403
    assert reg.get_sample_value("kvmesh_router_requests_total", {"status": "4xx"}) == before + 2


def test_router_client_drives_the_admin_plane_and_says_who_refused(fakes, start_router):
    import aiohttp
    from kvmesh.cluster.router_client import RouterClient

    router = start_router([], api_key="tenant-key", admin_key="admin-key")
    client = RouterClient(router.url, api_key="tenant-key", admin_key="admin-key")
    tenant_only = RouterClient(router.url, api_key="tenant-key")
    try:
        assert client.register("a", fakes[0].spec.url, fakes[0].spec.events, fakes[0].spec.replay) == \
            {"id": "a", "healthy": True}
        assert [r["id"] for r in client.replicas()] == ["a"]
        assert [(row.replica_id, row.healthy) for row in client.status()] == [("a", True)]
        with pytest.raises(aiohttp.ClientResponseError) as refused:
            tenant_only.register("b", fakes[1].spec.url, None, None)
        assert refused.value.status == 403
        assert client.deregister("a") is True and client.replicas() == []
    finally:
        client.close()
        tenant_only.close()
    with pytest.raises(aiohttp.ClientError):
        gone = RouterClient("http://127.0.0.1:9", timeout_s=2)  # nothing listens on the discard port
        try:
            gone.health()
        finally:
            gone.close()


def test_the_router_calls_replicas_with_the_internal_key_not_the_tenants(fakes, start_router):
    legit, _ = fakes
    router = start_router([legit.spec], api_key="tenant-key", upstream={"replica_api_key": "replica-secret"},
                          internal_key="cluster-internal-key")
    for i in range(4):
        r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(90 + i), "max_tokens": 2},
                       headers=TENANT, timeout=20)
        assert r.status_code == 200, r.text
    assert set(fake_stats(legit)["auth_seen"]) == {"Bearer cluster-internal-key"}
    assert "cluster-internal-key" not in repr(router.runtime.config)
    inside = {"Authorization": "Bearer cluster-internal-key"}  # the replicas' key is no key to the router
    assert httpx.post(router.url + "/v1/completions", json={"prompt": "hi"}, headers=inside).status_code == 401
    assert httpx.get(router.url + "/replicas", headers=inside).status_code == 403


@pytest.mark.parametrize("other", ["api_key", "admin_key"])
def test_the_internal_key_must_differ_from_the_keys_tenants_and_operators_hold(other):
    with pytest.raises(ValueError, match=f"internal_key equals {other}"):
        RouterConfig(block_size=BLOCK_SIZE, **{other: "same-secret-key"}, internal_key="same-secret-key")
