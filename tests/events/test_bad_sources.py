"""A bad frame costs one frame: it is counted and dropped, and every other source goes on.

Each case here is a frame that, unguarded, would kill the I/O thread and freeze the index of every
replica.
"""

import random
import time

import pytest
from events_testkit import CorruptingSocket, Follower, RawSource, make_publisher, stored, wait_for
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.wire import SNAPSHOT_TAG

FAST = SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5)

INVALID_UTF8 = b"\xac" + b"\xff\xfe\xfd" * 4  # a 13-byte msgpack string that is not UTF-8
NESTED = b"\x91" * 10_000 + b"\xc0"  # 10 KB of arrays nested in arrays
RANDOM = random.Random(16).randbytes(4096)  # bytes that made the old decoder raise UnicodeDecodeError


def publish_chain(pub, start, n):
    for h in range(start, start + n):
        pub.publish([stored(h, h - 1 if h > 1 else None)])


@pytest.fixture
def two_publishers():
    good, bad = make_publisher(), make_publisher()
    yield good, bad
    good.close()
    bad.close()


def follow(*pubs, config=FAST):
    sources = [PublisherSource(name, p.endpoint, p.replay_endpoint) for name, p in pubs]
    f = Follower(sources, config).start()
    for name, _ in pubs:
        assert wait_for(lambda n=name: f.sub.stats[n].snapshots == 1)
    assert all(f.joined(name, p) for name, p in pubs)
    return f


@pytest.mark.parametrize("garbage", [INVALID_UTF8, NESTED, RANDOM], ids=["invalid-utf8", "nested", "random"])
def test_a_garbage_payload_is_dropped_and_every_source_converges(two_publishers, garbage):
    good, bad = two_publishers
    bad._io._pub = CorruptingSocket(bad._io._pub, corrupt=lambda seq: seq == 3, garbage=garbage)
    f = follow(("good", good), ("bad", bad))
    try:
        publish_chain(bad, 1, 6)
        publish_chain(good, 1, 6)
        assert f.converges("bad", bad) and f.converges("good", good)
        assert f.sub.stats["bad"].decode_errors == 1 and f.sub.stats["bad"].bad_frames == 1
        assert f.sub.stats["good"].bad_frames == 0
        assert f.sub.feed_alive
    finally:
        f.close()


def test_a_snapshot_answer_with_a_short_seq_frame_fails_the_snapshot_not_the_feed():
    raw, good = RawSource(), make_publisher()
    f = Follower([PublisherSource("raw", raw.endpoint, raw.replay_endpoint),
                  PublisherSource("good", good.endpoint, good.replay_endpoint)], FAST).start()
    try:
        (identity, request), *_ = raw.requests()
        raw.router.send_multipart([identity, b"", SNAPSHOT_TAG, b"abc", b"\x93"])  # 3-byte seq frame
        assert wait_for(lambda: f.sub.stats["raw"].decode_errors == 1)
        assert wait_for(lambda: f.sub.stats["good"].snapshots == 1)
        assert f.joined("good", good)
        publish_chain(good, 1, 5)
        assert f.converges("good", good)
        assert f.sub.feed_alive and f.sub.stats["raw"].snapshot_failures >= 1
    finally:
        f.close()
        raw.close()
        good.close()


def test_a_source_that_keeps_sending_garbage_is_degraded_then_recovers_after_a_snapshot(two_publishers):
    good, bad = two_publishers
    corrupting = CorruptingSocket(bad._io._pub, corrupt=lambda seq: seq >= 2, garbage=RANDOM)
    bad._io._pub = corrupting
    config = SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5, bad_frame_threshold=3, degraded_probation_s=0.3,
                              bad_frame_window_s=30.0)
    statuses = []
    f = follow(("good", good), ("bad", bad), config=config)
    f.sub._on_status = lambda name, status, detail: statuses.append((name, status))
    try:
        publish_chain(bad, 1, 6)
        assert wait_for(lambda: ("bad", "degraded") in statuses)
        assert f.sub.stats["bad"].degradations == 1
        publish_chain(good, 1, 4)
        assert f.converges("good", good)  # the other source never noticed
        corrupting._corrupt = lambda seq: False  # the source behaves again; its resync goes through
        publish_chain(bad, 7, 2)
        assert wait_for(lambda: ("bad", "recovered") in statuses)
        assert f.converges("bad", bad)
        assert ("good", "degraded") not in statuses
    finally:
        f.close()


def test_a_batch_naming_too_many_blocks_is_rejected(two_publishers):
    good, _ = two_publishers
    f = follow(("good", good), config=SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5,
                                                       max_batch_blocks=8))
    try:
        big = [stored(h, h - 1 if h > 1 else None) for h in range(1, 11)]  # 10 blocks in one batch
        good.publish(big)
        assert wait_for(lambda: f.sub.stats["good"].decode_errors >= 1)
        assert f.states["good"].hashes().isdisjoint(range(1, 11))
        assert f.sub.feed_alive
    finally:
        f.close()


def test_a_snapshot_behind_the_live_seq_is_retried_with_back_off():
    raw = RawSource()
    config = SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5, recovery_backoff_s=0.05,
                              recovery_backoff_max_s=0.4, idle_probe_interval=None)
    f = Follower([PublisherSource("raw", raw.endpoint, raw.replay_endpoint)], config).start()
    rounds = 0
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # a source whose snapshot is always behind its live seq
            for identity, request in raw.requests(timeout_ms=50):
                rounds += 1
                if request == b"kvmesh:snapshot":
                    raw.router.send_multipart([identity, b"", SNAPSHOT_TAG, (0).to_bytes(8, "big"), b""])
                else:
                    raw.router.send_multipart([identity, b"", b"", b"\xff" * 8, b""])
            raw.pub.send_multipart([b"t", (1000).to_bytes(8, "big"), b"\x93\xcb" + b"\0" * 8 + b"\x90\x00"])
        assert f.sub.stats["raw"].backoffs > 0
        assert rounds < 60, f"{rounds} replay/snapshot rounds in 2 s: no back-off"
        assert f.sub.feed_alive
    finally:
        f.close()
        raw.close()


def test_a_crashed_feed_loop_is_reported_and_rebuilt(two_publishers):
    good, _ = two_publishers
    f = follow(("good", good), config=SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5,
                                                       feed_restart_s=0.05, degraded_probation_s=0.1))
    try:
        io = f.sub._io
        health = io.guard.health_of("good")
        while not health.record_bad(time.monotonic(), "test"):  # degraded just before the crash
            pass

        def boom():
            raise RuntimeError("a bug in the loop")

        io.guard.check_health = boom
        assert wait_for(lambda: f.sub.feed_error is not None)
        assert "a bug in the loop" in f.sub.feed_error
        assert wait_for(lambda: f.sub.feed_restarts == 1 and f.sub.feed_alive)
        publish_chain(good, 1, 5)
        assert f.converges("good", good)
        assert f.sub.stats["good"].snapshots >= 2  # the counters survived; the new loop resynced
        assert wait_for(lambda: ("good", "recovered") in f.statuses)  # its degraded state survived too
    finally:
        f.close()


def test_a_legitimate_batch_over_the_limit_is_recovered_through_a_snapshot():
    good = make_publisher(snapshot_chunk_blocks=32)  # snapshot chunks stay within the subscriber's limit
    f = follow(("good", good), config=SubscriberConfig(replay_timeout=5, snapshot_timeout=5, max_batch_blocks=50))
    try:
        good.publish([stored(h, h - 1 if h > 1 else None) for h in range(1, 101)])  # e.g. a resync batch
        publish_chain(good, 101, 3)
        assert f.converges("good", good)  # the snapshot arrives in chunks within the limit
        assert f.sub.stats["good"].decode_errors >= 1 and f.sub.stats["good"].unrecovered == 0
    finally:
        f.close()
        good.close()


def test_a_payload_over_max_payload_bytes_is_never_decoded_and_recovered_like_a_lost_one():
    pub = make_publisher(snapshot_chunk_blocks=2)
    config = SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5, max_payload_bytes=1000)
    f = follow(("r0", pub), config=config)
    try:
        pub.publish([stored(h, h - 1 if h > 1 else None, bs=64) for h in range(1, 9)])  # ~1.3 KB
        publish_chain(pub, 9, 3)
        assert f.converges("r0", pub), (f.sub.stats["r0"], f.states["r0"].keys() ^ pub._io.shadow.keys())
        assert f.sub.stats["r0"].rejected >= 1 and f.sub.stats["r0"].decode_errors == 0
    finally:
        f.close()
        pub.close()


def test_snapshot_frames_answering_a_replay_do_not_wedge_the_source():
    raw = RawSource()
    config = SubscriberConfig(replay_timeout=0.3, snapshot_timeout=0.3, snapshot_on_start=False,
                              idle_probe_interval=None)
    f = Follower([PublisherSource("raw", raw.endpoint, raw.replay_endpoint)], config).start()
    good = bytes.fromhex("93cb0000000000000000" "90" "00")  # an empty batch: [0.0, [], 0]
    try:
        assert wait_for(lambda: (raw.pub.send_multipart([b"t", (0).to_bytes(8, "big"), good]),
                                 f.sub.stats["raw"].batches >= 1)[1])
        raw.pub.send_multipart([b"t", (5).to_bytes(8, "big"), good])  # a gap: the subscriber asks for a replay
        (identity, _), *_ = raw.requests()
        raw.router.send_multipart([identity, b"", SNAPSHOT_TAG, b"abc", b""])
        tracker = f.sub._io.trackers["raw"]
        assert wait_for(lambda: tracker.mode == "live", timeout=5)  # gave up in time, not wedged
        assert f.sub.stats["raw"].decode_errors >= 1
    finally:
        f.close()
        raw.close()
