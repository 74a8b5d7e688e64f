"""The KV plane is the cluster's own (replica/server/kv_plane.py, replica/openai/auth.py): with an internal key
configured, only that key opens /kv/* and a body's ``kv_transfer_params``; the tenants' key still serves requests."""

from __future__ import annotations

import contextlib
import random

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

from ..conftest import CHAT_TEMPLATE
from .kv_replicas import SEED

TENANT = "tenant-api-key-1"
INTERNAL = "cluster-internal-key-1"
PROMPT = [random.Random(36).randrange(3, 500) for _ in range(100)]
CHAT = [{"role": "user", "content": "Once upon a time"}]
PULL = {"do_remote_prefill": True, "remote_url": "http://127.0.0.1:9"}


@contextlib.contextmanager
def replica(stories_path):
    config = EngineConfig(model=str(stories_path), hash_seed=SEED, kv_cache_memory=4 << 20)
    runtime = ReplicaRuntime.start(
        config, ReplicaServerConfig(port=0, event_port=None, api_key=TENANT, internal_key=INTERNAL),
        frontend=FrontendConfig(chat_template=CHAT_TEMPLATE),
        kv_transfer=KVTransferConfig(enabled=True, transport="local", timeout_s=5.0))
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


@pytest.fixture(scope="module")
def pair(stories_path):
    with replica(stories_path) as a, replica(stories_path) as b:
        yield a, b


def as_(runtime: ReplicaRuntime, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=runtime.http.url, headers=headers, timeout=60)


def kv_calls(c: httpx.Client) -> list[httpx.Response]:
    return [c.get("/kv/handshake"), c.post("/kv/lease", json={"prompt_token_ids": PROMPT}),
            c.post("/kv/release", json={"lease_id": "nope"})]


def test_kv_paths_refuse_a_caller_without_a_key(pair):
    with as_(pair[0], None) as c:
        for r in kv_calls(c):
            assert r.status_code == 401, r.text
            assert "internal key" in r.json()["error"]["message"]


def test_kv_paths_refuse_the_tenants_key_as_the_clusters_own(pair):
    with as_(pair[0], TENANT) as c:
        for r in kv_calls(c):
            assert r.status_code == 403, r.text
            assert "KV plane is the cluster's own" in r.json()["error"]["message"]


def test_kv_paths_open_to_the_internal_key(pair):
    with as_(pair[0], INTERNAL) as c:
        handshake, lease, release = kv_calls(c)
        assert handshake.status_code == 200 and lease.status_code == 200, (handshake.text, lease.text)
        assert release.status_code == 404  # an unknown lease: answered by the route, past the door


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stream": True}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "stream": True}),
    ("/v1/completions/render", {"prompt": PROMPT}),
    ("/v1/chat/completions/render", {"messages": CHAT}),
])
def test_a_tenant_sending_kv_transfer_params_is_refused(pair, path, body):
    a, _ = pair
    with as_(a, TENANT) as c:
        for params in (PULL, {"do_remote_decode": True}):
            r = c.post(path, json={**body, "kv_transfer_params": params})
            assert r.status_code == 403, r.text
            error = r.json()["error"]
            assert error["param"] == "kv_transfer_params" and "KV plane is the cluster's own" in error["message"]
        assert c.post(path, json={**body, "kv_transfer_params": None}).status_code == 200  # null asks nothing
        assert c.post(path, json=body).status_code == 200  # the tenants' key still serves requests


def test_an_escaped_spelling_is_the_same_field(pair):
    with as_(pair[0], TENANT) as c:
        raw = b'{"prompt": [5, 6, 7], "max_tokens": 1, "kv_transfer\\u005fparams": {"do_remote_decode": true}}'
        r = c.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 403 and r.json()["error"]["param"] == "kv_transfer_params"


def test_the_internal_key_hands_kv_over_between_replicas(pair):
    a, b = pair
    with as_(a, INTERNAL) as ca, as_(b, INTERNAL) as cb:
        held = ca.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                                 "kv_transfer_params": {"do_remote_decode": True}})
        assert held.status_code == 200, held.text
        handle = {**held.json()["kv_transfer_params"], "remote_url": a.http.url}
        registered = cb.post("/kv/peers", json={"peers": [{"replica_id": "a", "url": a.http.url}]})
        assert registered.status_code == 200, registered.text  # a puller calls registered peers only
        pulled = cb.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": handle})
        assert pulled.status_code == 200, pulled.text
        assert pulled.headers["x-kvmesh-kv-pull"] == "ok" and int(pulled.headers["x-kvmesh-kv-pulled-tokens"]) > 0


def test_a_replica_without_an_internal_key_keeps_its_api_key_rule(stories_path):
    config = EngineConfig(model=str(stories_path), hash_seed=SEED, kv_cache_memory=4 << 20)
    runtime = ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=None, api_key=TENANT),
                                   kv_transfer=KVTransferConfig(enabled=True, transport="local"))
    try:
        with as_(runtime, TENANT) as c:
            assert c.get("/kv/handshake").status_code == 200  # loopback only: no internal key to ask for
        with as_(runtime, None) as c:
            assert c.get("/kv/handshake").status_code == 401
    finally:
        runtime.shutdown(graceful_s=1)
