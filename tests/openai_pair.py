"""A real replica (stories260K) and a router in front of it, configured alike: the fixture ``pair``."""

from __future__ import annotations

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import CHAT_TEMPLATE

KEY = "tenant-key"
AUTH = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
FRONTEND = FrontendConfig(chat_template=CHAT_TEMPLATE, max_prompt_chars=4000, max_body_bytes=1 << 20,
                          header_timeout_s=1.0)
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def pair(stories_path):
    """(replica URL, router URL): the router routes to the replica and tokenizes as it does."""
    config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=32)
    replica = ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=0, replay_port=0, api_key=KEY,
                                                               served_model_name="stories"), frontend=FRONTEND)
    events = replica.endpoints()
    spec = ReplicaSpec(replica.http.url, events["events_endpoint"], events["replay_endpoint"], replica_id="r0")
    tokenizer = load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)
    router = RouterServer(RouterConfig(port=0, api_key=KEY, admin_key="admin-key",
                                       served_model_name="stories", frontend=FRONTEND,
                                       upstream=UpstreamConfig(poll_interval_s=0.2, replica_api_key=KEY)),
                          [spec], tokenizer=tokenizer).start()
    try:
        yield replica.http.url, router.url
    finally:
        router.stop()
        replica.shutdown(graceful_s=1)
