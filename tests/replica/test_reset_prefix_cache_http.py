"""``POST /reset_prefix_cache`` on a real replica (vLLM's admin route): the admin or the internal key only, every
unreferenced cached block freed, ``AllBlocksCleared`` on the event stream, the next identical prompt uncached."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.events.schema import AllBlocksCleared
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

from ..conftest import CHAT_TEMPLATE
from .test_server_http import STORY, replay

TENANT = "tenant-api-key-1"
ADMIN = "operator-admin-key-1"
INTERNAL = "cluster-internal-key-1"


@pytest.fixture(scope="module")
def replica(stories_path):
    config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20)
    runtime = ReplicaRuntime.start(
        config, ReplicaServerConfig(port=0, event_port=0, replay_port=0, api_key=TENANT, admin_key=ADMIN,
                                    internal_key=INTERNAL),
        frontend=FrontendConfig(chat_template=CHAT_TEMPLATE))
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


def as_(runtime: ReplicaRuntime, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=runtime.http.url, headers=headers, timeout=60)


def cached_tokens(client: httpx.Client) -> int:
    r = client.post("/v1/completions", json={"prompt": STORY, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize(("key", "status"), [(None, 403), (TENANT, 403)])
def test_a_tenant_or_no_key_cannot_reset_the_prefix_cache(replica, key, status):
    with as_(replica, TENANT) as tenant:
        cached_tokens(tenant)
        assert cached_tokens(tenant) > 0
        with as_(replica, key) as caller:
            r = caller.post("/reset_prefix_cache")
        assert r.status_code == status, r.text
        assert "error" in r.json()
        assert cached_tokens(tenant) > 0  # nothing was freed


@pytest.mark.parametrize("key", [ADMIN, INTERNAL])
def test_the_admin_or_internal_key_frees_every_cached_block_and_says_so_on_the_stream(replica, key):
    with as_(replica, TENANT) as tenant, as_(replica, key) as operator:
        cached_tokens(tenant)
        assert cached_tokens(tenant) > 0
        r = operator.post("/reset_prefix_cache")
        assert r.status_code == 200, r.text
        assert r.json()["freed_blocks"] > 0
        last_event = replay(replica.endpoints()["replay_endpoint"])[-1][1].events[-1]
        assert isinstance(last_event, AllBlocksCleared)
        assert cached_tokens(tenant) == 0  # computed afresh
        assert cached_tokens(tenant) > 0  # and cached again


def test_a_reset_of_an_empty_cache_frees_nothing(replica):
    with as_(replica, ADMIN) as operator:
        operator.post("/reset_prefix_cache")
        r = operator.post("/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"freed_blocks": 0}


def test_a_reset_restarts_the_intake_the_replica_publishes(replica):
    """The decayed prompt sums a replica publishes (routers price its cache's turnover and hit fraction by them)
    describe the blocks its cache took in: after a reset they start afresh, or a router would price the empty cache by
    the traffic of the one before (a benchmark's previous arm). Who booked what (``accepted``) is kept."""
    publishing = replica.state.load_publishing
    assert publishing is not None, "the replica publishes no load"
    with as_(replica, TENANT) as tenant, as_(replica, ADMIN) as operator:
        cached_tokens(tenant)
        before = publishing.update(force=True)
        assert before.recent_prefill > 0 and before.recent_prompt > 0 and before.recent_requests > 0
        assert operator.post("/reset_prefix_cache").status_code == 200
        after = publishing.update(force=True)
        assert (after.recent_prefill, after.recent_prompt, after.recent_requests) == (0, 0, 0)
        assert after.accepted == before.accepted and after.seq > before.seq
        cached_tokens(tenant)
        assert publishing.update(force=True).recent_prefill > 0  # counted again from there
