"""KV moved between two replica HTTP servers in one process (``local`` transport, real stories260K, real HTTP):
the decode side pulls what it lacks and answers the holder's greedy text, the prefill side hands out a lease,
leases end (released or expired), and every failure ends with the prompt computed, never a failed request."""

from __future__ import annotations

import logging
import random
import socket

import pytest
from kvmesh.router.replicas.load import ReplicaLoad

from .kv_replicas import KEY, client, kv_replica, metric, register, wait_for

PROMPT = [random.Random(32).randrange(3, 500) for _ in range(428)]  # 26 full blocks of 16 and 12 tokens
FULL_BLOCK_TOKENS = 416


@pytest.fixture(scope="module")
def pair(stories_path):
    """(holder A, puller B): two replicas with KV transfer on, behind the same API key."""
    with kv_replica(stories_path, replica_id="a") as a, kv_replica(stories_path, replica_id="b") as b:
        register(b, a)
        yield a, b


def complete(c, prompt=PROMPT, max_tokens=12, **extra):
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                        "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    return r


def cached(r) -> int:
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def fresh_prompt(seed: int) -> list[int]:
    return [random.Random(seed).randrange(3, 500) for _ in range(428)]


def test_decode_side_pulls_the_prompt_and_answers_the_holders_text(pair):
    a, b = pair
    prompt = fresh_prompt(1)
    with client(a) as ca, client(b) as cb:
        held = complete(ca, prompt)
        pulled = complete(cb, prompt, kv_transfer_params={"do_remote_prefill": True, "remote_url": a.http.url})
        assert pulled.headers["x-kvmesh-kv-pull"] == "ok"
        assert int(pulled.headers["x-kvmesh-kv-pulled-tokens"]) == FULL_BLOCK_TOKENS
        assert int(pulled.headers["x-kvmesh-kv-pulled-bytes"]) > 0
        assert cached(pulled) >= FULL_BLOCK_TOKENS
        assert pulled.json()["choices"][0]["text"] == held.json()["choices"][0]["text"]
        # B leased from A itself and released the lease after its read
        assert metric(ca, "kvmesh_kv_transfer_leases_total", 'end="released"') >= 1
        assert metric(ca, "kvmesh_kv_transfer_leases_active") == 0
        assert metric(cb, "kvmesh_kv_transfer_pulls_total", 'outcome="ok"') >= 1
        load = cb.get("/load").json()["kv_transfer"]
        assert load["enabled"] and load["pull_bytes_per_s"] > 0 and load["bytes_per_token"] > 0
        assert load["registered_peers"] == 1



def test_load_says_the_kv_layout_a_router_pairs_replicas_by(pair):
    a, b = pair
    with client(a) as ca, client(b) as cb:
        layouts = [c.get("/load").json()["kv_transfer"]["layout"] for c in (ca, cb)]
    assert layouts[0] == layouts[1]
    assert layouts[0]["block_size"] == 16 and layouts[0]["scales_digest"] == "" and layouts[0]["transport"] == "local"
    router_view = ReplicaLoad()
    router_view.update_transfer({"enabled": True, "layout": layouts[0]})
    assert router_view.kv_transfer_enabled and router_view.kv_layout.dtype == layouts[0]["dtype"]


def test_prefill_side_hands_a_lease_that_the_decode_side_pulls_and_releases(pair):
    a, b = pair
    prompt = fresh_prompt(2)
    with client(a) as ca, client(b) as cb:
        reference = complete(ca, prompt).json()["choices"][0]["text"]
        prefill = complete(ca, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()
        handle = prefill["kv_transfer_params"]
        assert handle["do_remote_prefill"] and not handle["do_remote_decode"]
        assert len(handle["remote_block_ids"]) == 26 and handle["num_tokens"] == FULL_BLOCK_TOKENS
        assert handle["remote_lease_id"] and handle["remote_engine_id"]
        assert metric(ca, "kvmesh_kv_transfer_leases_active") == 1
        released = metric(ca, "kvmesh_kv_transfer_leases_total", 'end="released"')
        decode = complete(cb, prompt, kv_transfer_params={**handle, "remote_url": a.http.url})
        assert decode.headers["x-kvmesh-kv-pull"] == "ok"
        assert cached(decode) >= FULL_BLOCK_TOKENS
        assert decode.json()["choices"][0]["text"] == reference
        assert metric(ca, "kvmesh_kv_transfer_leases_active") == 0
        assert metric(ca, "kvmesh_kv_transfer_leases_total", 'end="released"') == released + 1


def test_a_lease_holds_its_blocks_until_it_expires(stories_path):
    with kv_replica(stories_path, lease_ttl_s=0.3) as a, client(a) as ca:
        prompt = fresh_prompt(3)
        complete(ca, prompt, max_tokens=1)
        assert ca.get("/load").json()["kv_cache_usage"] == 0  # finished: cached but evictable
        lease = ca.post("/kv/lease", json={"prompt_token_ids": prompt}).json()
        assert len(lease["remote_block_ids"]) == 26 and lease["expires_in_s"] == pytest.approx(0.3)
        assert ca.get("/load").json()["kv_cache_usage"] > 0  # held like a running request holds them
        wait_for(lambda: metric(ca, "kvmesh_kv_transfer_leases_total", 'end="expired"') == 1, "the lease expiring")
        assert ca.get("/load").json()["kv_cache_usage"] == 0
        assert ca.post("/kv/release", json={"lease_id": lease["lease_id"]}).status_code == 404


def test_a_lease_of_a_prompt_the_replica_does_not_hold_is_empty(pair):
    a, _ = pair
    with client(a) as ca:
        lease = ca.post("/kv/lease", json={"prompt_token_ids": fresh_prompt(4)}).json()
        assert lease["lease_id"] == "" and lease["remote_block_ids"] == [] and lease["num_tokens"] == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_peer_means_the_prompt_is_computed_with_the_same_text(pair, stories_path):
    a, _ = pair
    prompt = fresh_prompt(5)
    dead = f"http://127.0.0.1:{_closed_port()}"
    with kv_replica(stories_path) as c, client(a) as ca, client(c) as cc:
        cc.post("/kv/peers", json={"peers": [{"replica_id": "dead", "url": dead}]}).raise_for_status()
        reference = complete(ca, prompt).json()["choices"][0]["text"]
        r = complete(cc, prompt, kv_transfer_params={"do_remote_prefill": True, "remote_url": dead})
        assert r.headers["x-kvmesh-kv-pull"] == "failed" and r.headers["x-kvmesh-kv-pulled-tokens"] == "0"
        assert cached(r) == 0 and r.json()["choices"][0]["text"] == reference


def test_a_peer_with_another_layout_is_refused_and_the_prompt_computed(pair, stories_path, caplog):
    a, _ = pair
    prompt = fresh_prompt(6)
    with kv_replica(stories_path, block_size=32) as c, client(a) as ca, client(c) as cc:
        register(c, a)
        reference = complete(ca, prompt).json()["choices"][0]["text"]
        with caplog.at_level(logging.WARNING):
            r = complete(cc, prompt, kv_transfer_params={"do_remote_prefill": True, "remote_url": a.http.url})
        assert r.headers["x-kvmesh-kv-pull"] == "failed"
        assert r.json()["choices"][0]["text"] == reference
        assert "different KV block layout" in caplog.text and "block_size" in caplog.text
        assert metric(ca, "kvmesh_kv_transfer_leases_active") == 0  # released after the failure too


def test_a_slow_handshake_does_not_stall_the_pullers_other_requests(pair, stories_path):
    """A first pull's handshake (nixl preparing the peer's descriptors; a TP replica asking every rank over Ray)
    runs off the server's loop: the replica keeps answering meanwhile."""
    import threading

    a, _ = pair
    with kv_replica(stories_path) as c, client(a) as ca, client(c) as cc:
        register(c, a)
        agent = c.state.kv_transfer.agent
        add_peer, entered, release = agent.add_peer, threading.Event(), threading.Event()

        def slow_add_peer(handshake):
            entered.set()
            release.wait(30)  # a handshake held until /health has answered
            return add_peer(handshake)

        agent.add_peer = slow_add_peer
        prompt = fresh_prompt(11)
        complete(ca, prompt)
        pulled = {}

        def pull():
            with client(c) as cp:
                pulled["r"] = complete(cp, prompt, kv_transfer_params={"do_remote_prefill": True,
                                                                       "remote_url": a.http.url})

        puller = threading.Thread(target=pull)
        puller.start()
        assert entered.wait(30), "the pull never reached its handshake"
        try:  # behind the handshake it would wait until released: the read times out first
            assert cc.get("/health", timeout=10).status_code == 200
        finally:
            release.set()
        puller.join(60)
        assert pulled["r"].headers["x-kvmesh-kv-pull"] == "ok"


def test_kv_routes_need_the_api_key(pair):
    a, _ = pair
    with client(a, api_key=None) as anonymous:
        assert anonymous.get("/kv/handshake").status_code == 401
        assert anonymous.post("/kv/lease", json={"prompt_token_ids": [1, 2]}).status_code == 401
        assert anonymous.post("/kv/release", json={"lease_id": "x"}).status_code == 401
    with client(a, api_key=KEY) as c:
        r = c.get("/kv/handshake")
        assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/kv/lease", {"prompt_token_ids": "nope"}, "prompt_token_ids"),
    ("/kv/lease", {"prompt_token_ids": [1], "ttl_s": -1}, "ttl_s"),
    ("/kv/lease", {"prompt_token_ids": [1], "lease_id": ""}, "lease_id"),
    ("/kv/peers", {"peers": [{"replica_id": "x", "url": "ftp://host"}]}, "peers"),
    ("/kv/peers", {"peers": "http://host"}, "peers"),
    ("/kv/lease", {}, "prompt_token_ids"),
    ("/kv/release", {"lease_id": 7}, "lease_id"),
    ("/v1/completions", {"prompt": [5, 6], "kv_transfer_params": "yes"}, "kv_transfer_params"),
    ("/v1/completions", {"prompt": [5, 6], "kv_transfer_params": {"remote_block_ids": ["a"]}},
     "kv_transfer_params.remote_block_ids"),
    ("/v1/completions", {"prompt": [5, 6], "kv_transfer_params": {"do_remote_prefill": True}},
     "kv_transfer_params.remote_url"),
    ("/v1/completions", {"prompt": [5, 6], "stream": True, "kv_transfer_params": {"do_remote_decode": True}},
     "kv_transfer_params.do_remote_decode"),
])
def test_bad_bodies_are_400s_naming_the_field(pair, path, body, field):
    a, _ = pair
    with client(a) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    assert field in r.text and "Traceback" not in r.text


def test_an_unknown_lease_is_a_404(pair):
    a, _ = pair
    with client(a) as c:
        r = c.post("/kv/release", json={"lease_id": "no-such-lease"})
    assert r.status_code == 404 and "no-such-lease" in r.json()["error"]["message"]


def test_a_replica_with_transfer_off_says_so_and_computes(stories_path, pair):
    a, _ = pair
    with kv_replica(stories_path, enabled=False) as off, client(off) as c:
        assert c.get("/kv/handshake").status_code == 503
        assert c.get("/load").json()["kv_transfer"] == {"enabled": False, "pull_bytes_per_s": None,
                                                       "bytes_per_token": None, "registered_peers": None,
                                                       "pull_fixed_s": None, "layout": None}
        r = complete(c, max_tokens=2, kv_transfer_params={"do_remote_prefill": True, "remote_url": a.http.url})
        assert r.headers["x-kvmesh-kv-pull"] == "skipped"
        handle = complete(c, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()["kv_transfer_params"]
        assert handle["remote_block_ids"] == [] and handle["remote_lease_id"] == ""


def test_streamed_answers_carry_the_pull_headers(pair):
    a, b = pair
    prompt = fresh_prompt(7)
    with client(a) as ca, client(b) as cb:
        complete(ca, prompt, max_tokens=1)
        with cb.stream("POST", "/v1/completions", json={
                "prompt": prompt, "max_tokens": 4, "stream": True,
                "kv_transfer_params": {"do_remote_prefill": True, "remote_url": a.http.url}}) as r:
            assert r.status_code == 200
            assert r.headers["x-kvmesh-kv-pull"] == "ok"
            assert int(r.headers["x-kvmesh-kv-pulled-tokens"]) == FULL_BLOCK_TOKENS
            assert "[DONE]" in r.read().decode()


def test_chat_takes_kv_transfer_params_on_both_sides(pair):
    a, b = pair
    messages = [{"role": "user", "content": " ".join(f"word{i}" for i in range(30))}]
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    with client(a) as ca, client(b) as cb:
        reference = ca.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        prefill = ca.post("/v1/chat/completions", json={**body, "max_tokens": 1,
                                                       "kv_transfer_params": {"do_remote_decode": True}})
        handle = prefill.json()["kv_transfer_params"]
        assert handle["num_tokens"] >= 16
        r = cb.post("/v1/chat/completions", json={**body, "kv_transfer_params": {**handle, "remote_url": a.http.url}})
        assert r.status_code == 200 and r.headers["x-kvmesh-kv-pull"] == "ok"
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= handle["num_tokens"]
        assert r.json()["choices"][0]["message"]["content"] == reference
