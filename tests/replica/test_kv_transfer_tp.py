"""KV pulled between two tensor-parallel replicas (TP=2 on CPU: one Ray worker process per rank, gloo, each rank
its own nixl agent and KV shard): rank r reads the holder's rank r blocks, the puller answers the holder's greedy
text with the pulled tokens cached, and a replica of another TP size is refused at the handshake naming tp."""

from __future__ import annotations

import random

import pytest
from kvmesh.replica.kv_transfer.agent import decode_handshake
from kvmesh.replica.kv_transfer.errors import KVLayoutMismatch
from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

from .kv_replicas import client, kv_replica, register

pytestmark = [pytest.mark.ray, pytest.mark.skipif(nixl_missing() is not None, reason=str(nixl_missing()))]

PROMPT = [random.Random(41).randrange(3, 500) for _ in range(428)]  # 26 full blocks of 16 and 12 tokens
FULL_BLOCK_TOKENS = 416
BODY = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tp_pair(ray_session, stories_path):
    """(holder A, puller B): two TP=2 replicas with KV transfer over nixl."""
    with kv_replica(stories_path, transport="nixl", tensor_parallel_size=2) as a, \
            kv_replica(stories_path, transport="nixl", tensor_parallel_size=2) as b:
        register(b, a)
        yield a, b


def test_a_pull_between_two_tp2_replicas_reads_every_rank_and_answers_the_holders_text(tp_pair):
    a, b = tp_pair
    with client(a) as ca, client(b) as cb:
        handshake = decode_handshake(ca.get("/kv/handshake").content)
        assert handshake.tp_size == 2 and len(handshake.ranks) == 2
        assert {h.layout.num_kv_heads for h in handshake.ranks} == {handshake.layout.num_kv_heads}
        held = cb.post("/v1/completions", json={**BODY, "cache_salt": "computed-on-b"}).json()  # other hashes
        computed_on_a = ca.post("/v1/completions", json=BODY)  # A computed it; B pulls it now
        assert computed_on_a.status_code == 200
        pulled = cb.post("/v1/completions", json={**BODY, "kv_transfer_params": {"do_remote_prefill": True,
                                                                                 "remote_url": a.http.url}})
        assert pulled.status_code == 200, pulled.text
        assert pulled.headers["x-kvmesh-kv-pull"] == "ok"
        assert int(pulled.headers["x-kvmesh-kv-pulled-tokens"]) == FULL_BLOCK_TOKENS
        rank_bytes = 26 * handshake.layout.bytes_per_block
        assert int(pulled.headers["x-kvmesh-kv-pulled-bytes"]) == 2 * rank_bytes  # both ranks' shards
        assert pulled.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= FULL_BLOCK_TOKENS
        text = pulled.json()["choices"][0]["text"]
        assert text == computed_on_a.json()["choices"][0]["text"] == held["choices"][0]["text"]


def test_a_replica_of_another_tp_size_is_refused_naming_tp_and_computes_the_prompt(tp_pair, stories_path):
    a, _ = tp_pair
    with kv_replica(stories_path, transport="nixl") as c, client(a) as ca, client(c) as cc:
        register(c, a)
        with pytest.raises(KVLayoutMismatch, match="tp"):
            c.state.kv_transfer.agent.add_peer(decode_handshake(ca.get("/kv/handshake").content))
        with pytest.raises(KVLayoutMismatch, match="tp"):
            a.state.kv_transfer.agent.add_peer(decode_handshake(cc.get("/kv/handshake").content))
        ca.post("/v1/completions", json=BODY)
        r = cc.post("/v1/completions", json={**BODY, "kv_transfer_params": {"do_remote_prefill": True,
                                                                            "remote_url": a.http.url}})
        assert r.status_code == 200 and r.headers["x-kvmesh-kv-pull"] == "failed"
        assert r.headers["x-kvmesh-kv-pulled-tokens"] == "0"
