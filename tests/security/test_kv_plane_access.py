"""The replicas' KV plane (/kv/handshake, /kv/lease, /kv/release) and the router's replica list are
the cluster's own, not the tenants'.

Before the fix the /kv routes answered anyone on a cluster without ``api_key`` and took the tenants' key on one
with it (the admin key got 401); /kv/lease was a prefix-cache oracle (how many tokens of a guessed prompt a
replica holds) and the handshake handed out the cache region's address and transport metadata; ``GET
/replicas`` on the router showed tenants the replicas' URLs. Each test asserts every caller but the cluster
itself gets an OpenAI-shaped 4xx and changes nothing.
"""

from __future__ import annotations

import re

import httpx
import pytest

from . import names
from .harness import BLOCK, DECODE, OTHER_STORY, PREFILL, KVCluster, is_refusal, unseen_text

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def strangers(c: KVCluster) -> dict[str, dict[str, str]]:
    """Every caller that is not the cluster: no key, a wrong key, the operator's admin key, a tenant's key."""
    callers = {"no key": {}, "wrong key": {"Authorization": "Bearer not-the-key"}, "admin key": c.admin()}
    if c.api_key:
        callers["tenant key"] = c.tenant()
    return {who: {**h, names.REPLICA_ID_HEADER: DECODE} for who, h in callers.items()}


def expected(who: str) -> set[int]:
    """The design's refusals: 403 for a tenant's key, 401 for none or a wrong one (the admin key: either)."""
    if who == "admin key":
        return {names.NO_KEY_STATUS, names.TENANT_KEY_STATUS}
    return {names.TENANT_KEY_STATUS if who == "tenant key" else names.NO_KEY_STATUS}


def test_the_kv_routes_refuse_everyone_but_the_cluster(kv_cluster, tokenizer, record):
    c = kv_cluster
    prompt = unseen_text(tokenizer, 4 * BLOCK + 3)
    c.hold(PREFILL, prompt, None)
    held = c.lease(PREFILL, prompt)  # the cluster's own lease: a stranger must not release it
    assert held.status_code == 200, held.text
    lease_id = held.json()["lease_id"]
    seen, granted = {}, []
    try:
        for who, headers in strangers(c).items():
            url = c.replica_url(PREFILL)
            before = c.leases_active(PREFILL)
            handshake = httpx.get(url + "/kv/handshake", headers=headers, timeout=10)
            lease = c.lease(PREFILL, prompt, headers=headers)
            if lease.status_code == 200 and lease.json().get("lease_id"):
                granted.append(lease.json()["lease_id"])
            taken = c.leases_active(PREFILL) - before
            release = c.release(PREFILL, lease_id, headers=headers)
            seen[who] = {"handshake": handshake.status_code, "handshake_bytes": len(handshake.content)
                         if handshake.status_code == 200 else 0, "lease": lease.status_code,
                         "lease_tokens": lease.json().get("num_tokens") if lease.status_code == 200 else None,
                         "leases_taken": taken, "release_of_the_clusters_lease": release.status_code}
            if release.status_code == 200:  # it was released: hold it again for the next caller
                lease_id = c.lease(PREFILL, prompt).json()["lease_id"]
    finally:
        for lease in [*granted, lease_id]:
            c.release(PREFILL, lease)
    record("kv routes open to strangers", **seen)
    for who, got in seen.items():
        want = expected(who)
        assert not 200 <= got["handshake"] < 300, f"{who}: /kv/handshake answered {got} (want {want})"
        assert not 200 <= got["lease"] < 300 and got["leases_taken"] == 0, f"{who}: /kv/lease {got} (want {want})"
        assert not 200 <= got["release_of_the_clusters_lease"] < 300, f"{who}: /kv/release {got} (want {want})"


def test_a_stranger_is_refused_in_the_openai_shape(kv_cluster):
    c = kv_cluster
    for who, headers in strangers(c).items():
        for method, path, body in (("GET", "/kv/handshake", None), ("POST", "/kv/lease", {"prompt_token_ids": [1]}),
                                   ("POST", "/kv/release", {"lease_id": "x"})):
            r = httpx.request(method, c.replica_url(DECODE) + path, json=body, headers=headers, timeout=10)
            assert is_refusal(r) and r.status_code in expected(who), (who, path, r.status_code, r.text[:200])


def test_kv_lease_is_no_prefix_cache_oracle(kv_cluster, tokenizer, record):
    c = kv_cluster
    head = unseen_text(tokenizer, BLOCK)
    secret = unseen_text(tokenizer, 2 * BLOCK, OTHER_STORY, bos=False)
    victim = head + secret + unseen_text(tokenizer, 2 * BLOCK, OTHER_STORY, bos=False)
    answer = c.via_router(c.completion_body(victim, 1))  # a victim's unsalted request, cached on a replica
    assert answer.status_code == 200, answer.text
    holder = answer.headers["x-kvmesh-replica"]
    near = head + secret[:BLOCK] + [(t + 1) % 500 for t in secret[BLOCK:]]
    wrong = head + [(t + 1) % 500 for t in secret]
    headers = c.tenant() if c.api_key else {}
    replies = {}
    for guess, ids in (("exact secret", head + secret), ("near guess", near), ("wrong guess", wrong)):
        before = c.leases_active(holder)
        r = c.lease(holder, ids, headers=headers)
        if r.status_code == 200 and r.json().get("lease_id"):
            c.release(holder, r.json()["lease_id"])
        replies[guess] = {"status": r.status_code, "cached_tokens": r.json().get("num_tokens")
                          if r.status_code == 200 else None, "leases_taken": c.leases_active(holder) - before}
    record("kv/lease oracle", holder=holder, **replies)
    for guess, reply in replies.items():
        assert not 200 <= reply["status"] < 300, f"a tenant asked /kv/lease about its {guess}: {replies}"
    assert len({(r["status"], r["cached_tokens"]) for r in replies.values()}) == 1, replies


def test_the_router_does_not_show_tenants_the_replicas(kv_cluster, record):
    c = kv_cluster
    urls = [c.replica_url(DECODE), c.replica_url(PREFILL)]
    ports = [u.rsplit(":", 1)[1] for u in urls]
    tenants = {"no key": {}, **({"tenant key": c.tenant()} if c.api_key else {})}
    seen = {}
    for who, headers in tenants.items():
        r = httpx.get(c.url + "/replicas", headers=headers, timeout=10)
        shown = [u for u, port in zip(urls, ports, strict=True) if re.search(rf":{port}\b", r.text)]
        seen[who] = {"status": r.status_code, "replica_urls_shown": len(shown)}
    admin = httpx.get(c.url + "/replicas", headers=c.admin(), timeout=10)
    record("GET /replicas shows tenants the replicas", admin=admin.status_code, **seen)
    for who, got in seen.items():
        assert got["replica_urls_shown"] == 0 and not 200 <= got["status"] < 300, f"{who}: {got}"
    assert admin.status_code == 200 and all(u in admin.text for u in urls), admin.text[:300]  # the operator's view
