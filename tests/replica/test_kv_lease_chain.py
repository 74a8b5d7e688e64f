"""A holder serves only what a request is entitled to: block ids come from its /kv/lease answer for the request's
own prompt and salt, never from the wire; a P/D handle's lease is shown only for the chain it holds; a puller
calls only registered peers, with its replica id (real stories260K replicas, ``local`` transport, real HTTP)."""

from __future__ import annotations

import http.server
import json
import random
import socket
import threading

import pytest
from kvmesh.replica.server.kv_peers import PeerRegistry, normalize_url

from .kv_replicas import client, kv_replica, metric, register


def fresh_prompt(seed: int) -> list[int]:
    return [random.Random(seed).randrange(3, 500) for _ in range(428)]  # 26 full blocks of 16


@pytest.fixture(scope="module")
def pair(stories_path):
    """(holder A, puller B), B with A registered as its peer."""
    with kv_replica(stories_path, replica_id="a") as a, kv_replica(stories_path, replica_id="b") as b:
        register(b, a)
        yield a, b


def complete(c, prompt, max_tokens=12, **extra):
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                        "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    return r


def text(r) -> str:
    return r.json()["choices"][0]["text"]


def test_block_ids_on_the_wire_are_never_read_a_tenant_cannot_pull_another_tenants_salted_blocks(pair):
    a, b = pair
    victim, attacker = fresh_prompt(21), fresh_prompt(22)
    with client(a) as ca, client(b) as cb:
        complete(ca, victim, cache_salt="victim")
        lease = ca.post("/kv/lease", json={"prompt_token_ids": victim, "cache_salt": "victim"}).json()
        victim_ids = lease["remote_block_ids"]
        assert len(victim_ids) == 26
        reference = text(complete(cb, attacker, cache_salt="reference"))
        r = complete(cb, attacker, cache_salt="attacker", kv_transfer_params={
            "do_remote_prefill": True, "remote_url": a.http.url, "remote_block_ids": victim_ids,
            "remote_block_media": ["GPU"] * 26})
        assert r.headers["x-kvmesh-kv-pulled-tokens"] == "0" and r.headers["x-kvmesh-kv-pull"] == "skipped"
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert text(r) == reference  # computed, not continued from the victim's KV
        ca.post("/kv/release", json={"lease_id": lease["lease_id"]}).raise_for_status()


def test_a_handles_lease_is_shown_only_for_the_chain_it_holds(pair):
    a, _ = pair
    prompt = fresh_prompt(23)
    with client(a) as ca:
        handle = complete(ca, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()[
            "kv_transfer_params"]
        lease_id = handle["remote_lease_id"]
        for other in ({"prompt_token_ids": fresh_prompt(24)}, {"prompt_token_ids": prompt, "cache_salt": "x"},
                      {"prompt_token_ids": prompt[:100]}):
            r = ca.post("/kv/lease", json={**other, "lease_id": lease_id})
            assert r.status_code == 409, r.text
            assert r.json()["error"]["param"] == "lease_id" and "does not hold this prompt" in r.text
            assert "remote_block_ids" not in r.text
        shown = ca.post("/kv/lease", json={"prompt_token_ids": prompt, "lease_id": lease_id}).json()
        assert shown["lease_id"] == lease_id and shown["remote_block_ids"] == handle["remote_block_ids"]
        assert ca.post("/kv/lease", json={"prompt_token_ids": prompt, "lease_id": "nope"}).status_code == 404
        assert ca.post("/kv/release", json={"lease_id": lease_id}).status_code == 200


def test_a_decode_request_with_another_prompts_handle_computes_and_releases_it(pair):
    a, b = pair
    prompt, other = fresh_prompt(25), fresh_prompt(26)
    with client(a) as ca, client(b) as cb:
        handle = complete(ca, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()[
            "kv_transfer_params"]
        assert metric(ca, "kvmesh_kv_transfer_leases_active") == 1
        reference = text(complete(cb, other, cache_salt="reference"))
        r = complete(cb, other, kv_transfer_params={**handle, "remote_url": a.http.url})
        assert r.headers["x-kvmesh-kv-pull"] == "failed" and r.headers["x-kvmesh-kv-pulled-tokens"] == "0"
        assert text(r) == reference
        assert metric(ca, "kvmesh_kv_transfer_leases_active") == 0  # the puller released the handle's lease


def test_an_unregistered_remote_url_gets_no_call_at_all(pair, caplog):
    _, b = pair
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with client(b) as cb, caplog.at_level("WARNING"):
            r = complete(cb, fresh_prompt(27), max_tokens=2,
                         kv_transfer_params={"do_remote_prefill": True, "remote_url": url})
        assert r.headers["x-kvmesh-kv-pull"] == "skipped"
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    assert "is not a registered peer" in caplog.text


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        _Recorder.seen.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
        answer = {"lease_id": "", "remote_block_ids": [], "num_tokens": 0, "remote_engine_id": "x",
                  "expires_in_s": 1.0} if self.path == "/kv/lease" else {"released_blocks": 0}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_pull_asks_a_registered_peer_for_the_prompts_lease_with_its_replica_id(pair):
    _, b = pair
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"  # registered with a trailing slash
    prompt = fresh_prompt(28)
    try:
        with client(b) as cb:
            cb.post("/kv/peers", json={"peers": [{"replica_id": "rec", "url": url}]}).raise_for_status()
            r = complete(cb, prompt, max_tokens=2, cache_salt="s", kv_transfer_params={
                "do_remote_prefill": True, "remote_url": url.rstrip("/"), "remote_lease_id": "the-handle",
                "remote_block_ids": [1, 2, 3]})
        assert r.headers["x-kvmesh-kv-pull"] == "skipped"
        lease, release = _Recorder.seen
        assert lease["path"] == "/kv/lease" and lease["headers"]["x-kvmesh-replica-id"] == "b"
        assert lease["body"] == {"prompt_token_ids": prompt, "cache_salt": "s", "lease_id": "the-handle"}
        assert release["path"] == "/kv/release" and release["body"] == {"lease_id": "the-handle"}
    finally:
        server.shutdown()
        server.server_close()
        register(b, pair[0])


@pytest.mark.parametrize(("url", "normal"), [
    ("http://Host:80/", "http://host:80"), ("http://host", "http://host:80"), ("https://h/", "https://h:443"),
    ("http://[::1]:8100", "http://[::1]:8100"), ("http://h:1/base/", "http://h:1/base"),
    ("http://user@h:1", None), ("http://h:1?x=1", None), ("ftp://h:1", None), ("http://h:port", None),
    ("http://", None),
])
def test_peer_urls_compare_normalized(url, normal):
    assert normalize_url(url) == normal


def test_the_registry_replaces_the_routers_set_and_keeps_the_static_peers():
    registry = PeerRegistry(("http://static:1",))
    registry.replace([("a", "http://a:1"), ("b", "http://b:2/")])
    assert registry.resolve("http://b:2") == "http://b:2" and registry.resolve("http://A:1/") == "http://a:1"
    registry.replace([("c", "http://c:3")])
    assert registry.resolve("http://a:1") is None and registry.resolve("http://c:3") == "http://c:3"
    assert registry.resolve("http://static:1/") == "http://static:1"
    assert registry.resolve("http://c:4") is None and registry.resolve("http://c:3/other") is None
    with pytest.raises(ValueError, match="'d' has url 'gopher://d'"):
        registry.replace([("d", "gopher://d")])
    assert registry.resolve("http://c:3") == "http://c:3"  # a refused set replaces nothing
