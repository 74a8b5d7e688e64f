"""The subscriber follows publishers in order and converges whatever was lost on the way."""

import asyncio
import threading
from contextlib import contextmanager

import pytest
import zmq
from events_testkit import (
    DroppingSocket,
    Follower,
    make_publisher,
    raw_publisher,
    stored,
    wait_for,
    wait_subscribed,
)
from kvmesh.events.codec import encode_batch
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, KVEventBatch
from kvmesh.events.subscribe.subscriber import EventSubscriber

FAST = SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5)
PATIENT = SubscriberConfig(replay_timeout=5, snapshot_timeout=5)
"""For tests that count replays and snapshots: an answer late on a loaded machine is not a lost one."""


def source(pub, name="r0", replay=True):
    return PublisherSource(name, pub.endpoint, pub.replay_endpoint if replay else None)


def publish_chain(pub, start, n, per_batch=1):
    for i in range(start, start + n, per_batch):
        pub.publish([stored(h, h - 1 if h > 1 else None) for h in range(i, min(i + per_batch, start + n))])


@contextmanager
def restarted_publisher(batches_before: int):
    """``(follower, p2)``: a follower that converged on a publisher's first ``batches_before`` batches,
    and the publisher's restart ``p2`` on the same ports (seq back to 0); both closed after."""
    p1 = make_publisher()
    endpoint, replay = p1.endpoint, p1.replay_endpoint
    f = Follower([PublisherSource("r0", endpoint, replay)], FAST).start()
    try:
        publish_chain(p1, 1, batches_before)
        assert f.converges("r0", p1)
        p1.close()
        p2 = make_publisher(endpoint="bind://" + endpoint, replay_endpoint=replay)
        try:
            yield f, p2
        finally:
            p2.close()
    finally:
        f.close()


@pytest.fixture
def pub():
    p = make_publisher()
    yield p
    p.close()


def test_a_late_joiner_converges_through_a_snapshot(pub):
    publish_chain(pub, 1, 50)
    pub.publish([BlockRemoved(block_hashes=[10, 11], medium="CPU")])
    f = Follower([source(pub)], PATIENT).start()
    try:
        publish_chain(pub, 51, 20)
        assert f.converges("r0", pub)
        assert f.sub.stats["r0"].snapshots == 1
    finally:
        f.close()


def test_dropped_batches_are_replayed(pub):
    pub._io._pub = DroppingSocket(pub._io._pub, drop=lambda seq: seq % 5 == 2)
    f = Follower([source(pub)], PATIENT).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].snapshots == 1)
        assert f.joined("r0", pub)
        publish_chain(pub, 1, 40)
        assert f.converges("r0", pub)
        st = f.sub.stats["r0"]
        assert st.gaps >= 1 and st.replays >= 1 and st.unrecovered == 0
    finally:
        f.close()


def test_a_gap_older_than_the_replay_buffer_falls_back_to_a_snapshot():
    p = make_publisher(buffer_steps=2)
    p._io._pub = DroppingSocket(p._io._pub, drop=lambda seq: 5 <= seq < 15)
    f = Follower([source(p)], FAST).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].snapshots == 1)
        assert f.joined("r0", p)
        publish_chain(p, 1, 30)
        assert f.converges("r0", p)
        assert f.sub.stats["r0"].snapshots >= 2
    finally:
        f.close()
        p.close()


def test_a_tiny_hwm_loses_messages_and_still_converges():
    p = make_publisher(hwm=1)
    gate = threading.Event()
    f = Follower([source(p)], SubscriberConfig(rcvhwm=1, replay_timeout=1, snapshot_timeout=1), gate=gate).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].snapshots == 1)
        assert f.joined("r0", p)
        p.publish([stored(999, None)])
        assert f.stopped.wait(5)  # the consumer naps (stops reading) at this first batch
        for i in range(60):  # ~100 KB per batch, so the socket buffers fill while the consumer naps
            p.publish([stored(1000 + i, None, bs=25_000)])
        assert wait_for(lambda: p.flushed() and p.seq == 61)  # sent, or dropped by the full PUB
        gate.set()
        publish_chain(p, 1, 20)  # sent after the dropped ones: the gap shows
        assert f.converges("r0", p, timeout=15)
        assert f.sub.stats["r0"].gaps >= 1  # the napping consumer did lose messages
    finally:
        f.close()
        p.close()


def test_a_restarted_subscriber_converges(pub):
    f = Follower([source(pub)], FAST).start()
    publish_chain(pub, 1, 20)
    assert f.converges("r0", pub)
    f.close()
    publish_chain(pub, 21, 20)
    pub.publish([BlockRemoved(block_hashes=[3], medium="CPU")])
    g = Follower([source(pub)], FAST).start()
    try:
        assert g.converges("r0", pub)
    finally:
        g.close()


def test_a_publisher_restart_is_detected_and_the_state_reset():
    with restarted_publisher(10) as (f, p2):
        assert wait_for(lambda: f.sub.stats["r0"].snapshots >= 1)
        assert p2.wait_for_subscribers()  # the SUB reconnects on its own
        publish_chain(p2, 100, 3)
        assert f.converges("r0", p2)
        assert f.sub.stats["r0"].restarts >= 1
        assert f.states["r0"].hashes() == {100, 101, 102}


def test_a_vllm_publisher_without_snapshots_is_followed_and_the_consumer_told(pub):
    io = pub._io
    io._send_snapshot = lambda identity: io._send_replay(identity, int.from_bytes(b"kvmesh:snapshot", "big"))
    publish_chain(pub, 1, 5)  # still in the replay buffer: a late joiner replays from seq 0
    f = Follower([source(pub)], FAST).start()
    try:
        publish_chain(pub, 6, 5)
        assert f.converges("r0", pub)
        st = f.sub.stats["r0"]
        assert st.snapshot_failures == 1 and st.snapshots == 0 and st.unrecovered == 0
        assert ("r0", "snapshot_failed") in f.statuses
    finally:
        f.close()


def test_a_replay_endpoint_that_never_answers_times_out_and_live_events_flow(pub):
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    cfg = SubscriberConfig(replay_timeout=0.2, snapshot_timeout=0.2)
    f = Follower([PublisherSource("r0", pub.endpoint, f"tcp://127.0.0.1:{port}")], cfg).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].unrecovered >= 1, 3)
        assert f.sub.stats["r0"].snapshot_failures == 1
        assert ("r0", "unrecovered") in f.statuses
        assert pub.wait_for_subscribers()
        publish_chain(pub, 1, 3)
        assert wait_for(lambda: f.states["r0"].hashes() == {1, 2, 3})
    finally:
        f.close()
        silent.close()


def test_bad_input_is_counted_and_never_stops_the_stream():
    raw_pub, endpoint = raw_publisher()
    f = Follower([PublisherSource("r0", endpoint)], FAST).start()

    def send(seq, payload, topic=b"t"):
        raw_pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    def good(h):
        return encode_batch(KVEventBatch(ts=0.0, events=[stored(h, None)], data_parallel_rank=0))

    try:
        assert wait_subscribed(raw_pub)  # a PUB drops what it sends before the subscription is up
        send(0, good(1))
        assert wait_for(lambda: f.states["r0"].hashes() == {1}, 3)
        restarts_before = f.sub.stats["r0"].restarts
        send(1, good(2))
        send(2, b"\xc1garbage")                                       # malformed payload
        send(3, b"\x93\xcb" + b"\0" * 8 + b"\x91\x81\xa4type\xa4Oops\x00")  # unknown event type
        raw_pub.send_multipart([b"t", b"only two frames"])            # wrong frame count
        raw_pub.send_multipart([b"t", b"\x01\x02", good(9)])          # seq frame not 8 bytes
        send(4, good(3))
        send(1, good(4))                                              # seq goes backwards
        send(2, good(5))
        assert wait_for(lambda: f.states["r0"].hashes() == {4, 5}, 3)
        st = f.sub.stats["r0"]
        assert st.decode_errors == 3 and st.unknown_events == 1
        assert st.restarts == restarts_before + 1
        assert f.sub._thread.is_alive()
    finally:
        f.close()
        raw_pub.close()


def test_a_bound_subscriber_collects_publishers_that_connect_to_it():
    sub_sources = [PublisherSource("a", "bind://tcp://127.0.0.1:0", topic="a"),
                   PublisherSource("b", "bind://tcp://127.0.0.1:0", topic="b")]
    f = Follower(sub_sources, FAST).start()
    pubs = []
    try:
        assert wait_for(lambda: f.sub.bound_endpoint("a") is not None)
        address = f.sub.bound_endpoint("a")
        assert f.sub.bound_endpoint("b") == address  # one socket, told apart by topic
        pubs = [make_publisher(endpoint=address, topic=t, replay_endpoint=None) for t in "ab"]
        assert all(p.wait_for_subscribers() for p in pubs)
        pubs[0].publish([stored(1, None)])
        pubs[1].publish([stored(2, None)])
        assert wait_for(lambda: f.states["a"].hashes() == {1} and f.states["b"].hashes() == {2})
    finally:
        for p in pubs:
            p.close()
        f.close()


async def test_batches_can_be_consumed_by_async_iteration(pub):
    sub = EventSubscriber([source(pub)], config=FAST).start()
    try:
        publish_chain(pub, 1, 1)
        got = []

        async def collect():
            async for name, seq, batch in sub:
                got.append((name, seq, batch.events))
                if any(e == stored(1, None) for e in batch.events):
                    return

        await asyncio.wait_for(collect(), timeout=5)
        assert got[0][2][0] == AllBlocksCleared()  # the snapshot comes first
    finally:
        sub.close()


def test_sources_can_be_added_and_removed_while_running(pub):
    f = Follower([], FAST).start()
    try:
        f.states["r0"] = __import__("kvmesh.events.state", fromlist=["CachedBlockSet"]).CachedBlockSet()
        f.sub.add_source(source(pub))
        publish_chain(pub, 1, 3)
        assert f.converges("r0", pub)
        f.sub.remove_source("r0")
        assert wait_for(lambda: "r0" not in f.sub.stats)
    finally:
        f.close()


def test_a_restarted_publisher_that_ran_ahead_is_caught_by_the_reconnect_snapshot():
    with restarted_publisher(3) as (f, p2):
        # Before we reconnect, the new publisher is already past our last seq (2): no seq check
        # can see the restart, the reconnect does.
        publish_chain(p2, 100, 10)
        assert f.converges("r0", p2)
        assert f.states["r0"].hashes() == set(range(100, 110))
        assert f.sub.stats["r0"].reconnects >= 1


def test_a_batch_lost_at_the_tail_of_a_burst_is_found_by_the_idle_probe(pub):
    f = Follower([source(pub)], SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5,
                                                 idle_probe_interval=0.2)).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].snapshots == 1)
        assert f.joined("r0", pub)
        pub._io._pub = DroppingSocket(pub._io._pub, drop=lambda seq: seq == 4)
        publish_chain(pub, 1, 5)  # seq 4 is the last: no later batch reveals the gap
        assert f.converges("r0", pub, timeout=3)
        assert f.sub.stats["r0"].gaps == 0 and f.sub.stats["r0"].last_seq == 4
    finally:
        f.close()


def test_an_older_vllm_publisher_is_followed_through_replays():
    from events_testkit import OldVllmPublisher

    old = OldVllmPublisher()
    cfg = SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5, idle_probe_interval=0.2)
    f = None
    try:
        def payload(h):
            return encode_batch(KVEventBatch(ts=0.0, events=[stored(h, h - 1 or None)], data_parallel_rank=0))

        old.publish(payload(1))  # before we join: only a replay from seq 0 can give it
        f = Follower([PublisherSource("v", old.endpoint, old.replay_endpoint)], cfg).start()
        assert wait_for(lambda: f.sub.stats["v"].snapshot_failures == 1)
        assert wait_subscribed(old.pub)
        old.publish(payload(2), send=False)  # lost on the way
        old.publish(payload(3))
        assert wait_for(lambda: f.states["v"].hashes() == {1, 2, 3} and f.sub.stats["v"].last_seq == 2)
        st = f.sub.stats["v"]
        assert st.snapshots == 0 and st.gaps == 1 and st.unrecovered == 0
        assert ("v", "snapshot_failed") in f.statuses
    finally:
        if f is not None:
            f.close()
        old.close()


def test_close_from_inside_the_callback_stops_cleanly(pub):
    seen = []

    def on_batch(name, seq, batch):
        seen.append(seq)
        sub.close()

    sub = EventSubscriber([source(pub)], on_batch=on_batch, config=FAST)
    sub.start()
    assert wait_for(lambda: not sub._thread.is_alive(), 3)
    assert seen == [-1]  # the (empty) start snapshot, then nothing more


def test_one_subscriber_follows_many_publishers_each_in_order():
    pubs = [make_publisher() for _ in range(4)]
    seqs: dict[str, list[int]] = {}
    sub = EventSubscriber([source(p, name=f"r{i}") for i, p in enumerate(pubs)],
                          on_batch=lambda name, seq, b: seqs.setdefault(name, []).append(seq), config=FAST)
    sub.start()
    try:
        assert wait_for(lambda: all(st.snapshots == 1 for st in sub.stats.values()) and len(sub.stats) == 4)
        assert all(p.wait_for_subscribers() for p in pubs)
        for k in range(20):
            for i, p in enumerate(pubs):
                p.publish([stored(1000 * i + k + 1, None)])
        assert wait_for(lambda: all(sub.stats[f"r{i}"].last_seq == 19 for i in range(4)))
        assert all(seqs[f"r{i}"] == [-1, *range(20)] for i in range(4))
    finally:
        sub.close()
        for p in pubs:
            p.close()


def test_re_adding_a_source_replaces_it_and_a_bad_one_does_not_stop_the_others(pub):
    f = Follower([source(pub)], FAST).start()
    try:
        f.sub.add_source(source(pub))                                   # identical: kept
        f.sub.add_source(PublisherSource("bad", "nosuch://transport"))  # zmq refuses: logged
        publish_chain(pub, 1, 3)
        assert f.converges("r0", pub)
        assert f.sub.stats["r0"].snapshots == 1 and "bad" not in f.sub.stats
    finally:
        f.close()


def test_an_unusable_replay_endpoint_is_reported_and_live_events_still_flow(pub):
    f = Follower([PublisherSource("r0", pub.endpoint, "nosuch://replay")], FAST).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].unrecovered >= 1)
        assert pub.wait_for_subscribers()
        publish_chain(pub, 1, 2)
        assert wait_for(lambda: f.states["r0"].hashes() == {1, 2})
    finally:
        f.close()
