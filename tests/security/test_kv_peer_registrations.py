"""Two routers in front of the same replicas keep their registered peer sets: ``POST /kv/peers`` used to keep only
the last set, so each router's re-registration dropped the other's replicas (their pulls were skipped).

A replica keeps one set per router (``router_id``), merges them, replaces a router's set only on that router's own
registration, and lets it lapse when the router stops renewing it within its ``ttl_s``; routers renew theirs every
``upstream.kv_peers_renew_s`` (replica/server/kv_peers.py, router/control/kv_peers.py).
"""

from __future__ import annotations

import pytest
from kvmesh.replica.server.kv_peers import PeerRegistry, normalize_url
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from ..router.conftest import fake_stats, launched_fakes, wait_for

TRANSFER = {"enabled": True, "pull_bytes_per_s": 1e9, "bytes_per_token": 64}
P, D, E = "http://p.test:1", "http://d.test:2", "http://e.test:3"
RENEW_S = 0.2
"""The live routers' renewal period: their registrations lapse after 0.6 s without one."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def urls(*raw: str) -> set[str]:
    return {normalize_url(u) for u in raw}


def test_each_routers_set_is_kept_replaced_only_by_itself_and_lapses_without_renewal():
    clock = Clock()
    peers = PeerRegistry(clock=clock)
    peers.replace([("p", P), ("d", D)], "router-a", ttl_s=3.0)
    peers.replace([("d", D), ("e", E)], "router-b", ttl_s=3.0)
    assert peers.urls() == urls(P, D, E) and peers.num_registered == 3  # merged: neither undid the other
    peers.replace([("d", D)], "router-a", ttl_s=3.0)  # a's own set shrinks: p goes, b's stay
    assert peers.urls() == urls(D, E) and peers.resolve(P) is None
    clock.now = 2.0
    peers.replace([("d", D)], "router-a", ttl_s=3.0)  # a renews, b does not
    clock.now = 3.5
    assert peers.urls() == urls(D) and peers.resolve(E) is None and peers.num_routers == 1
    peers.replace([("p", P)])  # a registration naming no router is one anonymous router's, without expiry
    clock.now = 100.0
    assert peers.urls() == urls(P)


def test_a_replica_keeps_a_bounded_number_of_routers():
    peers = PeerRegistry(max_routers=2, clock=Clock())
    peers.replace([("p", P)], "a", ttl_s=1.0)
    peers.replace([("d", D)], "b", ttl_s=1.0)
    with pytest.raises(ValueError, match="2 routers"):
        peers.replace([("e", E)], "c", ttl_s=1.0)
    peers.replace([("e", E)], "a", ttl_s=1.0)  # a known router may always replace its own
    assert peers.urls() == urls(D, E)


def start(stories_path, specs) -> RouterServer:
    cfg = RouterConfig(port=0, block_size=4, upstream=UpstreamConfig(poll_interval_s=0.1, connect_timeout_s=1.0,
                                                                     kv_peers_renew_s=RENEW_S))
    return RouterServer(cfg, specs, tokenizer=load_tokenizer(stories_path)).start()


def test_two_routers_in_front_of_one_replica_both_keep_their_peers(stories_path):
    with launched_fakes("p", "d", "e") as (p, d, e):
        for fake in (p, d, e):
            fake.configure(kv_transfer=TRANSFER)
        a = start(stories_path, [p.spec, d.spec])
        b = start(stories_path, [d.spec, e.spec])
        try:
            every = sorted(normalize_url(f.info["url"]) for f in (p, d, e))
            wait_for(lambda: fake_stats(d)["kv_peers"] == every, timeout=5, what="d's peers: both routers' sets")
            seen = len([r for r in fake_stats(d)["kv_peer_registrations"]
                        if r["router_id"] == a.runtime.kv_peers.router_id])
            wait_for(lambda: len([r for r in fake_stats(d)["kv_peer_registrations"]
                                  if r["router_id"] == a.runtime.kv_peers.router_id]) >= seen + 3,
                     timeout=5, what="router a renewing its registration with no change")
            assert fake_stats(d)["kv_peers"] == every
            b.stop()
            b = None
            mine = sorted(normalize_url(f.info["url"]) for f in (p, d))
            wait_for(lambda: fake_stats(d)["kv_peers"] == mine, timeout=5, what="the stopped router's set lapsed")
            assert all(r["ttl_s"] == pytest.approx(3 * RENEW_S) for r in fake_stats(d)["kv_peer_registrations"])
        finally:
            a.stop()
            if b is not None:
                b.stop()
