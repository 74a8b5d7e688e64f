"""A replica whose event stream cannot be trusted is routed to by load only; the others keep
their prefix matches (one bad source must not cost every replica)."""

import asyncio
import time

import zmq
from kvmesh.events.config import PublisherConfig
from kvmesh.events.publish.publisher import ZmqEventPublisher
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.routing.kv_router import KVRouter

from .helpers import stored

BS = 4
PROMPT = list(range(1, 33))  # 8 full blocks
UNPROBED = UpstreamConfig(poll_interval_s=3600.0)
"""The replicas here answer nothing on HTTP, and a probe refused a connection clears the replica's cache: probed once,
at the router's start, not while a test reads what the stream put in the index."""


def test_a_degraded_replica_counts_no_prefix_match_until_trusted_again():
    router = KVRouter(block_size=BS)
    for rid in ("a", "b"):
        router.add_replica(rid)
    router.apply_events("a", [stored(PROMPT, BS)])
    assert router.route(PROMPT, exclude=["b"]).matched_blocks == 8
    router.set_degraded(router.replicas.get("a"), "garbage on its stream")
    assert router.route(PROMPT, exclude=["b"]).matched_blocks == 0
    assert router.degraded == {"a": "garbage on its stream"}
    router.set_degraded(router.replicas.get("a"), None)
    assert router.route(PROMPT, exclude=["b"]).matched_blocks == 8


class Corrupting:
    """Replaces the live payloads of a publisher's PUB socket while ``on`` is set."""

    def __init__(self, sock) -> None:
        self.sock, self.on, self._frames = sock, True, []

    def send(self, frame, flags=0):
        self._frames.append(frame)
        if flags & zmq.SNDMORE:
            return
        frames, self._frames = self._frames, []
        if self.on:
            frames[2] = b"\xac\xff\xfe\xfd\xff\xfe\xfd\xff\xfe\xfd\xff\xfe\xfd"  # msgpack str, bad UTF-8
        self.sock.send_multipart(frames, flags)

    def close(self, *a, **kw):
        self.sock.close(*a, **kw)


def publisher() -> ZmqEventPublisher:
    return ZmqEventPublisher(PublisherConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0"))


async def wait_for(predicate, timeout=30.0) -> bool:
    """Whether ``predicate`` came to hold within ``timeout`` (a backstop: it returns once it holds; a router's first
    snapshot took over 8 s on a 2-core machine running the whole suite beside a CPU-bound process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


def test_garbage_from_one_replica_degrades_it_alone_and_a_snapshot_brings_it_back():
    good, bad = publisher(), publisher()
    runtime = RouterRuntime(RouterConfig(block_size=BS, upstream=UNPROBED), [
        ReplicaSpec("http://127.0.0.1:9", good.endpoint, good.replay_endpoint, replica_id="good"),
        ReplicaSpec("http://127.0.0.1:9", bad.endpoint, bad.replay_endpoint, replica_id="bad")])
    runtime.subscriber_config.bad_frame_threshold = 3
    runtime.subscriber_config.degraded_probation_s = 0.3
    runtime.subscriber_config.replay_timeout = runtime.subscriber_config.snapshot_timeout = 0.5
    corrupt = Corrupting(bad._io._pub)

    async def scenario():
        await runtime.start()
        try:
            r = runtime.router
            assert await wait_for(lambda: len(runtime.subscriber.stats) == 2 and all(
                s.snapshots for s in runtime.subscriber.stats.values()))
            assert await wait_for(lambda: good.subscribers >= 1 and bad.subscribers >= 1)
            bad._io._pub = corrupt
            for i in range(4):
                bad.publish([stored(PROMPT, BS, start_block=i, num_blocks=1)])
            good.publish([stored(PROMPT, BS)])
            assert await wait_for(lambda: "bad" in r.degraded), runtime.subscriber.stats
            assert await wait_for(lambda: r.index.num_blocks("good") == 8)
            assert "good" not in r.degraded
            text = runtime.metrics.render().decode()
            assert 'kvmesh_router_replica_degraded{reason="bad_frames",replica="bad"} 1.0' in text
            assert 'kvmesh_router_event_stream_total{counter="bad_frames",replica="bad"}' in text
            assert runtime.feed_state() == {"alive": True, "error": None, "restarts": 0}
            corrupt.on = False  # the replica behaves again: its resync snapshot restores trust
            bad.publish([stored(PROMPT, BS, start_block=4, num_blocks=1)])
            assert await wait_for(lambda: "bad" not in r.degraded)
            assert await wait_for(lambda: r.index.num_blocks("bad") == 5)
        finally:
            await runtime.stop()

    try:
        asyncio.run(scenario())
    finally:
        good.close()
        bad.close()


def test_a_replica_cannot_make_the_router_hold_more_than_max_source_blocks():
    pub = publisher()
    runtime = RouterRuntime(RouterConfig(block_size=BS, upstream=UNPROBED), [
        ReplicaSpec("http://127.0.0.1:9", pub.endpoint, pub.replay_endpoint, replica_id="r")])
    runtime.subscriber_config.max_source_blocks = 5

    async def scenario():
        await runtime.start()
        try:
            def stats():  # a fresh view each call: the property's dict lacks a source added after it was read
                return runtime.subscriber.stats.get("r")

            assert await wait_for(lambda: stats() is not None and stats().snapshots >= 1), stats()
            assert await wait_for(lambda: pub.subscribers >= 1)
            for i in range(8):
                pub.publish([stored(PROMPT, BS, start_block=i, num_blocks=1)])
            # the three stores past the limit refused (a resync's snapshot, of all eight, would be refused too)
            assert await wait_for(lambda: stats().apply_errors >= 3), stats()
            assert runtime.router.index.num_blocks("r") == 5
        finally:
            await runtime.stop()

    try:
        asyncio.run(scenario())
    finally:
        pub.close()


def test_health_says_when_the_event_feed_is_down(fakes, start_router, monkeypatch):
    """A dead feed freezes cache-aware routing for every replica: /health says so (status "degraded",
    still 200 since requests are served by load) instead of a silent 200 "ok"."""
    import httpx

    from .conftest import wait_for

    router = start_router([f.spec for f in fakes])
    wait_for(lambda: len(router.runtime.router.healthy) == len(fakes), what="replicas healthy")
    ok = httpx.get(router.url + "/health", timeout=10).json()
    assert ok["status"] == "ok" and ok["event_feed"]["alive"]
    monkeypatch.setattr(type(router.runtime), "feed_state",
                        lambda self: {"alive": False, "error": "RuntimeError('boom')", "restarts": 1})
    down = httpx.get(router.url + "/health", timeout=10)
    assert down.status_code == 200
    assert down.json()["status"] == "degraded" and "boom" in down.json()["warning"]
