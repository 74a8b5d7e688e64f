"""A conversation's next turn on its KV, live: the default policy before two idle stories260K replicas (events and
replay given, as the guides start them), a three-turn conversation with 2 s between turns, through
``/v1/chat/completions`` and through ``/v1/responses`` continued by ``previous_response_id``. Turns 2 and 3 go to the
replica holding the conversation and report its earlier turns cached: no replica has requests queued or running and
none is evicting, so the holder's uncached tokens cost what another replica's do (no turnover term on an idle fleet),
and its empty queue costs nothing.
"""

from __future__ import annotations

import time

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import ADMIN_KEY, wait_for

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
GAP_S = 2.0
"""Seconds between turns: each turn finished, the holder idle again, as a user types."""
TURNS = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her big red ball. "
         "One day, she saw a dog in the park and the dog wanted to play with the ball too.",
         "What did Lily do with the ball next?",
         "And what did the dog do after that?")


@pytest.fixture
def fleet(stories_path, tokenizer):
    """A router (the default policy) before two fresh replicas: no turnover carried over from another test."""
    from kvmesh.kvcache.hashing import cache_salt_secret, generate_seed
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    from ..conftest import CHAT_TEMPLATE

    runtimes, seed = [], generate_seed()
    try:
        for _ in range(2):
            config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8, hash_seed=seed)
            runtimes.append(ReplicaRuntime.start(config, ReplicaServerConfig(
                port=0, event_port=0, replay_port=0, served_model_name="stories"),
                                                 frontend=FrontendConfig(chat_template=CHAT_TEMPLATE)))
        specs = [ReplicaSpec(rt.http.url, rt.endpoints()["events_endpoint"], rt.endpoints()["replay_endpoint"],
                             replica_id=f"r{i}") for i, rt in enumerate(runtimes)]
        router = RouterServer(RouterConfig(port=0, block_size=BLOCK_SIZE, admin_key=ADMIN_KEY,
                                           served_model_name="stories",
                                           upstream=UpstreamConfig(poll_interval_s=0.2),
                                           cache_salt_secret=cache_salt_secret(seed)), specs,
                              tokenizer=tokenizer).start()
        try:
            wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
            assert router.runtime.router.policy.name == "cache_aware_tokens"
            yield router
        finally:
            router.stop()
    finally:
        for rt in runtimes:
            rt.shutdown(graceful_s=0.5)


def turn(router, path: str, body: dict) -> tuple[dict, httpx.Headers]:
    r = httpx.post(router.url + path, json={"max_tokens": 8, "temperature": 0, **body} if "chat" in path else
                   {"max_output_tokens": 8, "temperature": 0, **body}, headers={"x-kvmesh-receipt": "1"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json(), r.headers


def covered(prompt_tokens: int) -> int:
    """The earlier turn's prompt in full blocks: what its KV events stored."""
    return prompt_tokens // BLOCK_SIZE * BLOCK_SIZE


def check_turns(turns: list[tuple[int, int, httpx.Headers]]) -> None:
    """``turns``: (prompt tokens, cached tokens, receipt headers) per turn."""
    first = turns[0][2]["x-kvmesh-replica"]
    for (before, _, _), (_, cached, headers) in zip(turns, turns[1:], strict=False):
        why = {k: v for k, v in headers.items() if k.startswith("x-kvmesh-")}
        assert headers["x-kvmesh-replica"] == first, why
        assert headers["x-kvmesh-route-reason"] == "cache", why
        assert cached >= covered(before) > 0, why


def test_a_chat_conversation_stays_on_its_kv(fleet):
    messages, turns = [], []
    for i, text in enumerate(TURNS):
        if i:
            time.sleep(GAP_S)
        messages.append({"role": "user", "content": text})
        out, headers = turn(fleet, "/v1/chat/completions", {"messages": messages})
        usage = out["usage"]
        turns.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], headers))
        messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
    check_turns(turns)


def test_a_responses_conversation_by_previous_response_id_stays_on_its_kv(fleet):
    previous, turns = None, []
    for i, text in enumerate(TURNS):
        if i:
            time.sleep(GAP_S)
        body = {"model": "stories", "input": text} | ({"previous_response_id": previous} if previous else {})
        out, headers = turn(fleet, "/v1/responses", body)
        usage = out["usage"]
        turns.append((usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], headers))
        previous = out["id"]
    check_turns(turns)
