"""Two routers in front of one live stories260K replica, one given the cluster's salt secret the documented way
(``KVMESH_ROUTER_CACHE_SALT_SECRET``, hex), one given none: the first matches salted prompts against the blocks the
replica cached for either router; the second matches none, and its ``/replicas`` and log say so."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import httpx
import pytest
from kvmesh.cluster.config.loader import load
from kvmesh.cluster.config.trees import ROUTER_SCHEMA
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import ADMIN_KEY, replica_rows, wait_for

pytestmark = pytest.mark.slow

STORY = ("the little dog ran to the park and played with a red ball all day long, and when the sun went down "
         "he walked home with his friend the cat, who had watched him from the old wooden bench.")


def predicted(router: RouterServer, prompt: str, cache_salt: str) -> int:
    r = httpx.post(router.url + "/v1/completions", headers={"x-kvmesh-receipt": "1"}, timeout=60,
                   json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_salt": cache_salt})
    assert r.status_code == 200, r.text
    return int(r.headers["x-kvmesh-predicted-hit-tokens"])


def blocks(router: RouterServer) -> int:
    return router.runtime.router.index.num_blocks("r0")


def test_only_the_router_given_the_secret_matches_salted_prompts_and_the_other_says_so(stories_path, tokenizer,
                                                                                       caplog):
    from kvmesh.kvcache.hashing import cache_salt_secret, generate_seed
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    seed = generate_seed()
    runtime = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=4,
                                                hash_seed=seed),
                                                ReplicaServerConfig(port=0, event_port=0, replay_port=0))
    routers: dict[str, RouterServer] = {}
    try:
        ends = runtime.endpoints()
        specs = [ReplicaSpec(runtime.http.url, ends["events_endpoint"], ends["replay_endpoint"], replica_id="r0")]
        base = RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.2), admin_key=ADMIN_KEY)
        given = load(ROUTER_SCHEMA, None, env={"KVMESH_ROUTER_CACHE_SALT_SECRET": cache_salt_secret(seed).hex()})
        with caplog.at_level(logging.WARNING, logger="kvmesh.router.control.probes"):
            for name, secret in (("given", given.router.cache_salt_secret), ("none", None)):
                config = replace(base, cache_salt_secret=secret)
                routers[name] = RouterServer(config, specs, tokenizer=tokenizer).start()
            for router in routers.values():
                wait_for(lambda r=router: len(r.runtime.router.healthy) == 1, what="the replica healthy")
        assert [row["salt_keys_match"] for row in replica_rows(routers["given"])] == [True]
        assert [row["salt_keys_match"] for row in replica_rows(routers["none"])] == [False]
        warned = [r.getMessage() for r in caplog.records if "another salt secret" in r.getMessage()]
        assert len(warned) == 1 and "KVMESH_ROUTER_CACHE_SALT_SECRET" in warned[0], warned

        for first, second, hit in (("none", "given", True), ("given", "none", False)):
            prompt = f"{first} {time.monotonic_ns()}: {STORY}"
            seen = blocks(routers[second])
            assert predicted(routers[first], prompt, "tenant-a") == 0
            wait_for(lambda s=second, n=seen: blocks(routers[s]) > n, what=f"the {second} router applied the events")
            assert (predicted(routers[second], prompt, "tenant-a") > 0) is hit, (first, second)
            assert predicted(routers[second], prompt, "tenant-b") == 0  # another tenant's salt never matches
    finally:
        for router in routers.values():
            router.stop()
        runtime.shutdown(graceful_s=0.5)
