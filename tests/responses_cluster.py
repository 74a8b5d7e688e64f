"""Two real replicas (stories260K, the ChatML tools template, the hermes parser) behind a router whose keys file names
two tenants: the fixture ``cluster`` of the Responses API's live tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .router.conftest import wait_for
from .tool_chat_template import CHATML_TOOLS_TEMPLATE

KEY = "router-key-0123456789"
"""The router's own key (the shared tenant) and the replicas' key."""
TENANT_KEYS = {"ann": "sk-ann-0123456789", "bob": "sk-bob-0123456789"}
FRONTEND = FrontendConfig(chat_template=CHATML_TOOLS_TEMPLATE, enable_auto_tool_choice=True, tool_call_parser="hermes")
BLOCK_SIZE = 16


def router_config(keys_file: str, seed: bytes, frontend: FrontendConfig = FRONTEND, **fields) -> RouterConfig:
    from kvmesh.kvcache.hashing import cache_salt_secret

    return RouterConfig(port=0, api_key=KEY, admin_key="admin-key-0123456789", served_model_name="stories",
                        block_size=BLOCK_SIZE, frontend=frontend, cache_salt_secret=cache_salt_secret(seed),
                        admission=AdmissionConfig(keys_file=keys_file),
                        upstream=UpstreamConfig(poll_interval_s=0.2, replica_api_key=KEY), **fields)


@dataclass
class Cluster:
    router: RouterServer
    """A router before both replicas."""
    replica_urls: list[str]
    specs: list[ReplicaSpec]
    start: Callable[..., RouterServer]
    """``start(**frontend)``: another router before them, with these frontend settings."""
    config: Callable[..., RouterConfig]
    """``config(**fields)``: a router's config for them (the keys file, the cluster's salt secret)."""


@pytest.fixture(scope="module")
def cluster(stories_path, tmp_path_factory):
    """A router before two replicas, and how to start others (``Cluster``)."""
    from kvmesh.kvcache.hashing import generate_seed

    seed = generate_seed()
    keys = tmp_path_factory.mktemp("responses") / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - {{key: {key}, tenant: {name}}}\n" for name, key in TENANT_KEYS.items()))
    replicas, routers = [], []
    try:
        for _ in range(2):
            engine = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8, hash_seed=seed)
            replicas.append(ReplicaRuntime.start(engine, ReplicaServerConfig(
                port=0, event_port=0, replay_port=0, api_key=KEY, served_model_name="stories"), frontend=FRONTEND))
        specs = [ReplicaSpec(rt.http.url, rt.endpoints()["events_endpoint"], rt.endpoints()["replay_endpoint"],
                             replica_id=f"r{i}") for i, rt in enumerate(replicas)]

        def start(**frontend) -> RouterServer:
            config = router_config(str(keys), seed, replace(FRONTEND, **frontend))
            tokenizer = load_tokenizer(stories_path, chat_template=CHATML_TOOLS_TEMPLATE)
            routers.append(RouterServer(config, specs, tokenizer=tokenizer).start())
            wait_for(lambda: len(routers[-1].runtime.router.healthy) == len(specs), what="the replicas healthy")
            return routers[-1]

        yield Cluster(start(), [rt.http.url for rt in replicas], specs, start,
                      lambda **fields: router_config(str(keys), seed, **fields))
    finally:
        for router in routers:
            router.stop()
        for rt in replicas:
            rt.shutdown(graceful_s=1)
