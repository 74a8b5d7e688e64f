"""The tenant a replica charges a grammar compile to is the one the router's key check found
(replica/openai/compile_tenant.py): the router sends it on every request it forwards, whatever ``user`` says,
and a client may not send it itself (router/http/router_only.py)."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig

from .conftest import fake_stats, wait_for

KEYS = {"heavy": "sk-heavy-0123456789", "light": "sk-light-0123456789"}
BODY = {"prompt": "Once upon a time", "max_tokens": 2, "structured_outputs": {"choice": ["yes", "no"]}}


@pytest.fixture
def keyed(fakes, start_router, tmp_path):
    """A router with a keys file (``user`` sub-tenants on: the worst case) in front of fake replica "a"."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - {{key: {key}, tenant: {name}}}\n" for name, key in KEYS.items()))
    router = start_router([fakes[0].spec], admission=AdmissionConfig(keys_file=str(keys), user_tenants=True))
    wait_for(lambda: router.runtime.router.healthy, what="the replica healthy")
    fakes[0].configure(reset_stats=True)
    return router


def _post(router, key: str, body: dict, headers: dict | None = None, path: str = "/v1/completions"):
    return httpx.post(router.url + path, json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}", **(headers or {})})


def test_every_user_name_of_a_key_is_forwarded_as_the_keys_tenant(keyed, fakes):
    for i in range(20):  # more names than a key's sub-tenants
        r = _post(keyed, KEYS["heavy"], {**BODY, "user": f"sock-puppet-{i}"})
        assert r.status_code == 200, r.text
    r = _post(keyed, KEYS["light"], {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                     "user": "heavy"}, path="/v1/chat/completions")
    assert r.status_code == 200, r.text
    assert fake_stats(fakes[0])["tenants_seen"] == ["heavy"] * 20 + ["light"]


@pytest.mark.parametrize("name", ["x-kvmesh-tenant", "X-KvMesh-Tenant"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_client_may_not_name_its_compile_tenant(keyed, fakes, name, path):
    body = BODY if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = _post(keyed, KEYS["heavy"], body, {name: "light"}, path)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "x-kvmesh-tenant" and "the router sets it" in error["message"], error
    assert fake_stats(fakes[0])["tenants_seen"] == []  # nothing reached the replica


def test_an_open_router_names_the_shared_tenant(fakes, start_router):
    router = start_router([fakes[0].spec])
    wait_for(lambda: router.runtime.router.healthy, what="the replica healthy")
    fakes[0].configure(reset_stats=True)
    for user in ("a", "b", None):
        assert httpx.post(router.url + "/v1/completions", json={**BODY, "user": user}, timeout=30).status_code == 200
    assert fake_stats(fakes[0])["tenants_seen"] == ["default"] * 3
