"""Lost events: a gap that neither replay nor a snapshot could fill degrades the replica,
drops what the router believed it holds (the lost batch may have removed it), and asks for a
snapshot; once one is applied the replica is exact again. Real ZeroMQ, in-process publisher."""

import asyncio
import time

import zmq
from kvmesh.events.codec import encode_batch
from kvmesh.events.config import PublisherConfig, PublisherSource, SubscriberConfig
from kvmesh.events.publish.publisher import ZmqEventPublisher
from kvmesh.events.schema import KVEventBatch
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.event_feed import EventFeed
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.control.stream_watch import StreamWatch
from kvmesh.router.http.metrics import RouterMetrics
from kvmesh.router.routing.kv_router import KVRouter

from ..events.events_testkit import DroppingSocket, OldVllmPublisher
from .helpers import removed, stored
from .test_degraded_source import wait_for

BS = 4
PROMPT = list(range(1, 33))  # 8 full blocks
OTHER = list(range(101, 133))


class Deaf:
    """Makes a publisher's replay/snapshot socket swallow requests unanswered while ``on`` is set."""

    def __init__(self, pub: ZmqEventPublisher) -> None:
        self.on = False
        io, answer = pub._io, pub._io._serve_requests

        def serve() -> None:
            if not self.on:
                return answer()
            try:
                while True:
                    io._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                pass

        io._serve_requests = serve


def test_an_unrepairable_gap_degrades_the_replica_until_a_snapshot_resync():
    pub = ZmqEventPublisher(PublisherConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0"))
    runtime = RouterRuntime(RouterConfig(block_size=BS, upstream=UpstreamConfig(poll_interval_s=3600)),
                            [  # no HTTP: no polls
        ReplicaSpec("http://127.0.0.1:9", pub.endpoint, pub.replay_endpoint, replica_id="r")])
    runtime.subscriber_config.replay_timeout = runtime.subscriber_config.snapshot_timeout = 0.3
    deaf, lost_seq = Deaf(pub), []
    pub._io._pub = DroppingSocket(pub._io._pub, lambda seq: seq in lost_seq)
    r = runtime.router

    def holds(prompt) -> int:  # what the index says, whether or not routing may use it
        return r.index.match(r.hasher.keys(prompt)).get("r", 0)

    async def scenario():
        await runtime.start()
        r.set_healthy(r.replicas.get("r"), True)  # routable, as if it answered /health
        try:
            stats = lambda: runtime.subscriber.stats.get("r")  # noqa: E731
            assert await wait_for(lambda: stats() is not None and stats().snapshots == 1)
            pub.publish([stored(PROMPT, BS)])
            assert await wait_for(lambda: holds(PROMPT) == 8)

            deaf.on = True
            lost_seq.append(pub.seq)
            pub.publish([removed(PROMPT, BS, range(8))])  # lost: the router would keep matching PROMPT
            pub.publish([stored(OTHER, BS)])  # shows the gap; replay and snapshot go unanswered
            assert await wait_for(lambda: "lost events" in (r.degraded.get("r") or ""))
            assert holds(PROMPT) == 0  # forgotten, not matched against blocks the replica no longer has
            assert r.route(PROMPT).matched_blocks == 0 and r.route(OTHER).matched_blocks == 0
            text = runtime.metrics.render().decode()
            assert 'kvmesh_router_replica_degraded{reason="lost_events",replica="r"} 1.0' in text
            await asyncio.sleep(1.0)  # what must not happen (an absence): time alone does not make it exact
            assert "r" in r.degraded

            deaf.on = False  # the asked-for snapshot is answered: exact again
            assert await wait_for(lambda: "r" not in r.degraded, timeout=15)
            assert holds(PROMPT) == 0 and holds(OTHER) == 8
            assert r.route(OTHER).matched_blocks == 8
        finally:
            await runtime.stop()

    try:
        asyncio.run(scenario())
    finally:
        pub.close()


def test_a_publisher_gone_while_its_replica_serves_degrades_it_until_it_is_back():
    """A replica that reports no seq (vLLM): the connection to its publisher is what shows."""
    pub = ZmqEventPublisher(PublisherConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0"))
    endpoint, replay = pub.endpoint, pub.replay_endpoint
    runtime = RouterRuntime(RouterConfig(block_size=BS, upstream=UpstreamConfig(poll_interval_s=0.1),
                                         events=SubscriberConfig(max_lag_s=0.5)), [
        ReplicaSpec("http://127.0.0.1:9", endpoint, replay, replica_id="v")])
    r = runtime.router
    pubs = [pub]

    async def scenario():
        await runtime.start()
        try:
            stats = lambda: runtime.subscriber.stats.get("v")  # noqa: E731 (a fresh view: "v" may come later)
            assert await wait_for(lambda: stats() is not None and stats().snapshots == 1), stats()
            await asyncio.sleep(1.5)  # what must not happen (an absence): idle 3x events_max_lag_s, connected: fine
            assert r.degraded == {}
            await asyncio.to_thread(pub.close)
            assert await wait_for(lambda: "no connection to its publisher" in (r.degraded.get("v") or ""))
            pubs.append(ZmqEventPublisher(PublisherConfig(endpoint="bind://" + endpoint, replay_endpoint=replay)))
            assert await wait_for(lambda: "v" not in r.degraded)
        finally:
            await runtime.stop()

    try:
        asyncio.run(scenario())
    finally:
        for p in pubs:
            p.close()


def test_batches_replayed_to_a_router_that_joined_late_are_not_lateness():
    """A router (re)started beside a vLLM replica (replay, no snapshots) replays its stream from seq 0: those batches
    were published long ago and are applied now, which says nothing of how current the live stream is. (The feed
    alone: a router's HTTP probe of a replica that is not there would clear what the replay put in.)"""
    old = OldVllmPublisher()
    long_ago = time.time() - 300
    for i in range(3):
        old.publish(encode_batch(KVEventBatch(ts=long_ago + i, events=[stored(PROMPT, BS, start_block=i,
                                                                                num_blocks=1)])), send=False)
    router = KVRouter(block_size=BS)
    router.add_replica("v")
    feed = EventFeed(router, RouterMetrics(), StreamWatch(1.0, router), SubscriberConfig(max_lag_s=1.0))

    async def scenario():
        feed.start()
        try:
            feed.subscriber.add_source(PublisherSource("v", old.endpoint, old.replay_endpoint))
            assert await wait_for(lambda: router.index.num_blocks("v") == 3, timeout=15)
            assert router.degraded == {}, router.degraded
            assert router.route(PROMPT).matched_blocks == 3
            assert router.replicas.get("v").stream.lag_s is None  # no live batch yet: no lag to report
        finally:
            await asyncio.to_thread(feed.close)

    try:
        asyncio.run(scenario())
    finally:
        old.close()
