"""What a publisher can make a subscriber hold is bounded in bytes, not only in messages
(RCVHWM 100,000 x MAXMSGSIZE 128 MiB on the SUB and an unbounded replay DEALER let one plain stream
grow a router to 23 GB)."""

import time

import pytest
import zmq
from events_testkit import Follower, RawSource, make_publisher, raw_socket, recv_until_end, stored, wait_for
from kvmesh.events.codec import encode_batch
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.schema import BlockRemoved, KVEventBatch
from kvmesh.events.subscribe.tracker import REPLAY, SourceTracker
from kvmesh.events.wire import SNAPSHOT_REQUEST

GARBAGE = b"\xac\xff\xfe\xfd\xff\xfe\xfd\xff\xfe\xfd\xff\xfe\xfd"  # a msgpack str that is not UTF-8


def seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


def removed_payload(n_hashes: int) -> bytes:
    return encode_batch(KVEventBatch(ts=0.0, events=[BlockRemoved(block_hashes=list(range(1, n_hashes + 1)),
                                                                  medium="CPU")]))


@pytest.mark.parametrize("max_payload_bytes", [8 << 20, 1 << 20, 1000])
def test_each_socket_a_source_can_fill_holds_at_most_max_source_queue_bytes(max_payload_bytes):
    pub = make_publisher()
    config = SubscriberConfig(max_payload_bytes=max_payload_bytes, replay_timeout=0.5, snapshot_timeout=0.5)
    f = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)], config).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].snapshots == 1)  # the replay DEALER exists now
        sockets = [feed.sock for feed in f.sub._io._feeds.values()] + list(f.sub._io.requests.dealers.values())
        assert len(sockets) == 2
        for sock in sockets:
            held = sock.getsockopt(zmq.RCVHWM) * sock.getsockopt(zmq.MAXMSGSIZE)
            assert 0 < held <= config.max_source_queue_bytes
            assert sock.getsockopt(zmq.MAXMSGSIZE) >= max_payload_bytes  # a legitimate batch still fits
    finally:
        f.close()
        pub.close()


def test_a_message_over_max_message_bytes_costs_a_reconnect_not_the_source():
    """ZeroMQ drops the connection after a frame over MAXMSGSIZE and, a protocol error, never
    reconnects by itself: the subscriber connects again (and counts it as a bad frame)."""
    raw = RawSource()
    config = SubscriberConfig(max_payload_bytes=1000, snapshot_on_start=False, idle_probe_interval=None)
    f = Follower([PublisherSource("raw", raw.endpoint)], config).start()
    try:
        ok = removed_payload(3)
        assert wait_for(lambda: (raw.pub.send_multipart([b"", seq(0), ok]), f.sub.stats["raw"].batches >= 1)[1])
        raw.pub.send_multipart([b"", seq(1), b"\0" * (config.max_message_bytes + 1)])  # ZeroMQ refuses it
        assert wait_for(lambda: f.sub.stats["raw"].reconnects >= 1)
        before = f.sub.stats["raw"].batches
        assert wait_for(lambda: (raw.pub.send_multipart([b"", seq(2), ok]), f.sub.stats["raw"].batches > before)[1])
        assert f.sub.stats["raw"].rejected >= 1 and f.sub.feed_alive
    finally:
        f.close()
        raw.close()


def test_batches_held_during_a_recovery_are_capped_in_bytes_and_the_oldest_go():
    delivered = []
    t = SourceTracker("r0", deliver=lambda name, s, b: delivered.append(s), request=lambda *a: None,
                      notify=lambda *a: None, has_replay=True, max_pending_bytes=100)
    t.on_live(0, KVEventBatch(ts=0.0, events=[]), 40)
    for s in range(2, 7):  # a gap at 1: a replay is asked for and these wait, 40 bytes each
        t.on_live(s, KVEventBatch(ts=0.0, events=[]), 40)
    assert t.mode == REPLAY
    assert len(t.pending) == 2 and t.pending.bytes == 80 and t.pending.first_seq() == 5
    assert t.stats.pending_overflows == 3
    t.on_replay_end()  # the replay brought nothing: what was dropped is a hole, recovered by a snapshot
    assert delivered == [0] and t.mode != "live"


def test_a_degraded_source_over_its_decode_budget_is_dropped_unread_and_stays_degraded():
    raw = RawSource()
    config = SubscriberConfig(bad_frame_threshold=3, bad_frame_window_s=30.0, snapshot_on_start=False,
                              idle_probe_interval=None, degraded_source_bytes_per_s=2000)
    f = Follower([PublisherSource("raw", raw.endpoint)], config).start()
    try:
        assert wait_for(lambda: (raw.pub.send_multipart([b"", seq(0), GARBAGE]),
                                 ("raw", "degraded") in f.statuses)[1])
        big = removed_payload(1000)  # ~2.7 KB: over the 2000-byte budget, never decoded while degraded
        batches = f.sub.stats["raw"].batches
        for n in range(1, 3):
            raw.pub.send_multipart([b"", seq(n), big])
        assert wait_for(lambda: f.sub.stats["raw"].over_budget >= 1)
        st = f.sub.stats["raw"]
        assert st.batches == batches and st.rejected >= st.over_budget >= 1
        assert f.sub._io.turns.paused  # its socket is left unread meanwhile: more would wait in the publisher
        assert ("raw", "recovered") not in f.statuses and f.sub.feed_alive
        small = removed_payload(2)  # within the budget: decoded and delivered
        assert wait_for(lambda: (raw.pub.send_multipart([b"", seq(100), small]),
                                 f.sub.stats["raw"].batches > batches)[1], timeout=5)
    finally:
        f.close()
        raw.close()


def test_the_replay_socket_drops_a_peer_sending_big_frames_and_serves_the_others():
    pub = make_publisher()
    for h in range(1, 4):
        pub.publish([stored(h, h - 1 if h > 1 else None)])
    assert wait_for(pub.flushed)
    flooder = raw_socket(zmq.DEALER, pub.replay_endpoint)
    asker = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        for _ in range(20):
            flooder.send_multipart([b"", b"\0" * (1 << 20)], copy=False)  # 20 MB of "requests"
        asker.send_multipart([b"", SNAPSHOT_REQUEST])
        answers = recv_until_end(asker)
        assert len(answers) == 2  # one chunk, then the end
        assert not flooder.poll(200)  # no answer: its frames were never taken for requests
        assert pub.stats["bad_requests"] == 0
    finally:
        flooder.close()
        asker.close()
        pub.close()


def test_a_snapshot_over_max_snapshot_bytes_is_refused_before_it_is_held_and_replay_recovers():
    pub = make_publisher(snapshot_chunk_blocks=16)
    for h in range(1, 201, 50):
        pub.publish([stored(k, k - 1 if k > 1 else None) for k in range(h, h + 50)])
    assert wait_for(pub.flushed)
    config = SubscriberConfig(max_snapshot_bytes=1000, replay_timeout=0.5, snapshot_timeout=0.5)
    f = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)], config).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].snapshot_failures >= 1)
        assert f.sub.stats["r0"].rejected >= 1
        assert f.converges("r0", pub)  # the replay buffer still reaches back to seq 0
    finally:
        f.close()
        pub.close()


def _rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * 4096


def test_a_peer_streaming_a_message_that_never_ends_is_cut_off_by_what_its_connection_holds():
    from events_testkit import EndlessMessagePeer

    peer, good = EndlessMessagePeer(), make_publisher()
    config = SubscriberConfig(max_payload_bytes=1 << 20, max_source_queue_bytes=4 << 20, snapshot_on_start=False,
                              idle_probe_interval=None)
    assert config.max_connection_bytes == 8 << 20
    f = Follower([PublisherSource("endless", peer.endpoint), PublisherSource("good", good.endpoint)], config)
    start = _rss()
    f.start()
    try:
        peak = start
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and peak - start < 400 << 20 and f.sub.stats["endless"].reconnects < 2:
            good.publish([stored(1, None)])
            peak = max(peak, _rss())
            time.sleep(0.02)
        st = f.sub.stats["endless"]
        assert st.rejected >= 1 and st.reconnects >= 1  # cut off, and followed again
        assert (peak - start) < 400 << 20, f"RSS grew {(peak - start) >> 20} MiB"  # ~570 MB/s unchecked
        assert f.sub.stats["good"].batches > 0 and f.sub.stats["good"].bad_frames == 0
        assert f.sub.feed_alive
    finally:
        f.close()
        peer.close()
        good.close()


def test_a_replay_socket_answering_a_message_that_never_ends_is_cut_off_before_its_timeout():
    from events_testkit import EndlessMessagePeer

    peer, pub = EndlessMessagePeer(b"ROUTER"), make_publisher()
    config = SubscriberConfig(max_payload_bytes=1 << 20, max_source_queue_bytes=4 << 20, snapshot_timeout=30.0,
                              idle_probe_interval=None)
    f = Follower([PublisherSource("r0", pub.endpoint, peer.endpoint)], config)  # asks it for a snapshot
    start = _rss()
    f.start()
    try:
        st = f.sub.stats["r0"]  # cut off and the snapshot given up, long before snapshot_timeout
        assert wait_for(lambda: st.rejected >= 1 and st.snapshot_failures >= 1, timeout=10)
        assert _rss() - start < 400 << 20 and f.sub.feed_alive
    finally:
        f.close()
        peer.close()
        pub.close()


def test_memory_the_process_spends_elsewhere_is_not_charged_to_an_idle_source():
    """48 rejected 10 MB request bodies grew the router by ~500 MB, and the old RSS watch cut the
    healthy replicas' streams ("a message that never ends?"). Bytes are counted per connection now."""
    pub = make_publisher()
    config = SubscriberConfig(max_payload_bytes=1 << 20, max_source_queue_bytes=4 << 20, idle_probe_interval=None)
    f = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)], config).start()
    try:
        assert wait_for(lambda: f.sub.stats["r0"].snapshots == 1)
        assert wait_for(lambda: f.sub._io._feed_of["r0"].bytes.counted)
        bodies = [bytearray(10 << 20) for _ in range(48)]  # touched pages: +480 MB of RSS, nothing received
        for body in bodies:
            body[::4096] = b"\1" * len(body[::4096])
        checks = f.sub._io.counts.checks
        assert wait_for(lambda: f.sub._io.counts.checks > checks + 5)  # several counts went by
        pub.publish([stored(1, None)])
        assert wait_for(lambda: f.sub.stats["r0"].batches == 2)
        st = f.sub.stats["r0"]
        assert st.bad_frames == 0 and st.reconnects == 0 and st.degradations == 0
        del bodies
    finally:
        f.close()
        pub.close()
