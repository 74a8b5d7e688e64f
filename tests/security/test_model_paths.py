"""``/v1/models`` shows tenants served names and parents, not host paths: it used to show the directories of the
model and of every adapter (vLLM's ``root``) to anyone with the API key.

``root`` is the host path for the operator only -- on the router the admin key; on a replica the admin key or the
internal key (the router learns model paths and adapter paths from it) -- and the served name for everyone else.
"""

from __future__ import annotations

import httpx
import pytest
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from ..router.conftest import launched_fakes, wait_for

API, ADMIN, INTERNAL = "tenant-key-models", "admin-key-models", "internal-key-models"
ADAPTER_DIR = "/srv/secret/adapters/sql"
"""An adapter's host path (the router only learns it; nothing is loaded from it)."""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def roots(client: httpx.Client, key: str) -> dict[str, tuple[str, str | None]]:
    r = client.get("/v1/models", headers=bearer(key))
    assert r.status_code == 200, r.text
    return {card["id"]: (card["root"], card.get("parent")) for card in r.json()["data"]}


def test_the_router_shows_tenants_no_host_path(stories_path):
    with launched_fakes("paths") as (fake,):
        cfg = RouterConfig(port=0, block_size=4, api_key=API, admin_key=ADMIN, model=str(stories_path),
                           served_model_name="stories", upstream=UpstreamConfig(poll_interval_s=0.1,
                                                                                connect_timeout_s=1.0))
        server = RouterServer(cfg, [fake.spec], tokenizer=load_tokenizer(stories_path)).start()
        try:
            wait_for(lambda: server.runtime.router.healthy, what="the fake replica healthy")
            server.runtime.models.catalog.learn_adapter("sql", ADAPTER_DIR, None)
            with httpx.Client(base_url=server.url, timeout=10) as client:
                tenant, admin = roots(client, API), roots(client, ADMIN)
                text = client.get("/v1/models", headers=bearer(API)).text
        finally:
            server.stop()
    assert tenant == {"stories": ("stories", None), "sql": ("sql", "stories")}
    assert str(stories_path) not in text and ADAPTER_DIR not in text
    assert admin == {"stories": (str(stories_path), None), "sql": (ADAPTER_DIR, "stories")}


@pytest.fixture(scope="module")
def keyed_replica(stories_path):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    engine = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20)
    server = ReplicaServerConfig(host="127.0.0.1", port=0, event_port=0, replay_port=0, api_key=API,
                                 admin_key=ADMIN, internal_key=INTERNAL, served_model_name="stories")
    runtime = ReplicaRuntime.start(engine, server)
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


def test_a_replica_shows_the_path_to_the_router_and_the_admin_only(keyed_replica, stories_path):
    with httpx.Client(base_url=keyed_replica.http.url, timeout=10) as client:
        assert roots(client, API) == {"stories": ("stories", None)}
        assert str(stories_path) not in client.get("/v1/models", headers=bearer(API)).text
        assert roots(client, ADMIN) == roots(client, INTERNAL) == {"stories": (str(stories_path), None)}


def test_a_replica_adapter_card_shows_its_path_only_when_asked():
    from kvmesh.replica.server.lora_models import ServedLoRAs
    from kvmesh.replica.serving.lora_request import LoRARequest

    loras = ServedLoRAs(None, ("stories",), True, [LoRARequest("sql", 1, ADAPTER_DIR)])
    (tenant,) = loras.cards(512, paths=False)
    (operator,) = loras.cards(512, paths=True)
    assert (tenant.root, tenant.parent) == ("sql", "stories")
    assert (operator.root, operator.parent) == (ADAPTER_DIR, "stories")


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info", "/model_info", "/get_model_info"])
def test_a_replicas_info_routes_show_the_path_to_the_router_and_the_admin_only(keyed_replica, stories_path, path):
    with httpx.Client(base_url=keyed_replica.http.url, timeout=10) as client:
        tenant = client.get(path, headers=bearer(API))
        assert tenant.status_code == 200, tenant.text
        assert str(stories_path) not in tenant.text and tenant.json()["model_path"] == "stories"
        internal = client.get(path, headers=bearer(INTERNAL))  # the router's key (the admin's is refused here)
        assert internal.json()["model_path"] == str(stories_path), internal.text
