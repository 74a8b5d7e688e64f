"""An adapter unloaded and loaded again from other weights through the router, in front of two real stories260K
replicas that publish KV events and pull prefixes from each other (the in-process ``local`` transport, round
robin): every answer after the reload is the new weights' greedy text, as an adapter loaded fresh from them, whichever
replica serves it -- neither the old blocks on a replica nor a pull of them from its peer -- while a pull between the
two replicas holding the same new files still hits."""

from __future__ import annotations

import contextlib
import random

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.routing.kv_placement import KVPlacementRules
from kvmesh.router.routing.receipts import HEADER_PULLED_FROM, HEADER_PULLED_TOKENS

from ..conftest import CHAT_TEMPLATE
from ..replica.kv_replicas import SEED
from ..replica.lora_fixtures import make_adapter
from .conftest import wait_for

pytest.importorskip("peft")

ADMIN, INTERNAL = "admin-key-000001", "internal-key-0002"
PROMPT = [random.Random(44).randrange(3, 500) for _ in range(209)]  # 13 full blocks of 16


@contextlib.contextmanager
def lora_replica(stories_path):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.kv_transfer.config import KVTransferConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    runtime = ReplicaRuntime.start(
        EngineConfig(model=str(stories_path), hash_seed=SEED, kv_cache_memory=4 << 20, dtype="float32",
                     enable_lora=True, max_loras=2, max_lora_rank=8),
        ReplicaServerConfig(port=0, event_port=0, replay_port=0, internal_key=INTERNAL),
        frontend=FrontendConfig(chat_template=CHAT_TEMPLATE),
        kv_transfer=KVTransferConfig(enabled=True, transport="local", lease_ttl_s=30.0, timeout_s=5.0))
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


@pytest.fixture(scope="module")
def weights(stories_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("reload")
    make_adapter(stories_path, root / "old", seed=21)
    make_adapter(stories_path, root / "new", seed=22)
    return root


@pytest.fixture(scope="module")
def cluster(stories_path, tokenizer):
    """A router (round robin, peer pulls priced cheap) in front of replicas "a" and "b"."""
    with lora_replica(stories_path) as a, lora_replica(stories_path) as b:
        specs = [ReplicaSpec(rt.http.url, rt.endpoints()["events_endpoint"], rt.endpoints()["replay_endpoint"],
                             replica_id=name) for name, rt in (("a", a), ("b", b))]
        router = RouterServer(RouterConfig(port=0, admin_key=ADMIN, internal_key=INTERNAL, policy="round_robin",
                                           upstream=UpstreamConfig(poll_interval_s=0.1),
                                           transfers=KVPlacementRules(peer_pull_overhead_s=0.001)), specs,
                              tokenizer=tokenizer).start()
        try:
            loads = router.runtime.router.loads.loads
            wait_for(lambda: len(router.runtime.router.healthy) == 2 and all(
                load.kv_transfer_enabled for load in loads.values()), timeout=30, what="replicas healthy, transfer on")
            yield router
        finally:
            router.stop()


def admin(router, path: str, body: dict) -> None:
    r = httpx.post(router.url + path, json=body, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 200, r.text


def identities(router, name: str) -> set:
    return {served.identities.get(name) for served in router.runtime.models.catalog.served.values()}


def complete(router, model: str) -> httpx.Response:
    r = httpx.post(router.url + "/v1/completions", timeout=120, headers={"x-kvmesh-receipt": "1"},
                   json={"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r


def settle(router, replica: str, model: str) -> None:
    """The replica's blocks of the last request are in the router's index and its prefill rate is known."""
    rt = router.runtime.router
    wait_for(lambda: rt.index.num_blocks(replica) >= len(PROMPT) // 16 and rt.loads.loads[replica].prefill_tokens_per_s,
             timeout=30, what=f"{model}'s blocks on {replica} in the index")


def test_after_a_reload_from_other_weights_every_replica_answers_as_the_new_weights(cluster, weights):
    router = cluster
    admin(router, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(weights / "old")})
    wait_for(lambda: None not in identities(router, "x"), timeout=10, what="both replicas' identity of x")
    (old_identity,) = identities(router, "x")
    first = complete(router, "x")
    holder = first.headers["x-kvmesh-replica"]
    settle(router, holder, "x")

    admin(router, "/v1/unload_lora_adapter", {"lora_name": "x"})
    admin(router, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(weights / "new")})
    wait_for(lambda: len(identities(router, "x") - {None, old_identity}) == 1 and None not in identities(router, "x"),
             timeout=10, what="both replicas' new identity of x")
    away = complete(router, "x")  # round robin: the replica that does not hold the old blocks
    assert away.headers["x-kvmesh-replica"] != holder and HEADER_PULLED_FROM not in away.headers
    assert away.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    settle(router, away.headers["x-kvmesh-replica"], "x")
    back = complete(router,
                    "x")  # on the old holder: the new weights' blocks pulled from its peer, not its own old ones
    assert back.headers["x-kvmesh-replica"] == holder
    assert back.headers[HEADER_PULLED_FROM] == away.headers["x-kvmesh-replica"]
    assert int(back.headers[HEADER_PULLED_TOKENS]) >= 192

    admin(router, "/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": str(weights / "new")})
    fresh = complete(router, "fresh")
    text = fresh.json()["choices"][0]["text"]
    assert first.json()["choices"][0]["text"] != text  # the old and new weights do differ on this prompt
    assert away.json()["choices"][0]["text"] == text and back.json()["choices"][0]["text"] == text


def test_an_adapter_with_weights_that_are_not_finite_is_a_400_through_the_router(cluster, weights, tmp_path):
    from ..replica.test_lora_identity import poisoned

    tensor = poisoned(weights / "old", tmp_path / "nan", float("inf"))
    r = httpx.post(cluster.url + "/v1/load_lora_adapter", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60,
                   json={"lora_name": "bad", "lora_path": str(tmp_path / "nan")})
    assert r.status_code == 400 and tensor in r.json()["error"]["message"], r.text
    assert "bad" not in cluster.runtime.models.catalog.adapters()
