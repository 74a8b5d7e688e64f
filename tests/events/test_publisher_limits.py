"""The replay/snapshot socket has limits: a peer that floods it with requests it never reads gets
a bounded share of the replica (without limits a flood took it from 508 to 750 MB and its p99
from 12 to 168 ms)."""

import time

import pytest
import zmq
from events_testkit import Follower, make_publisher, raw_socket, recv_until_end, stored, wait_for
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.wire import SNAPSHOT_REQUEST


def cached_publisher(n_blocks=2000, **limits):
    pub = make_publisher(**limits)
    for h in range(1, n_blocks + 1, 100):
        pub.publish([stored(k, k - 1 if k > 1 else None) for k in range(h, h + 100)])
    assert wait_for(pub.flushed)
    return pub


def test_a_snapshot_flood_gets_only_the_snapshot_budget_and_busy_answers():
    pub = cached_publisher(snapshots_per_s=1.0, snapshot_burst=2)
    flooder = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        start = time.monotonic()
        for _ in range(50):
            flooder.send_multipart([b"", SNAPSHOT_REQUEST])  # never read
        assert wait_for(lambda: pub.stats["snapshots"] + pub.stats["throttled"] == 50)
        elapsed = time.monotonic() - start
        assert pub.stats["snapshots"] <= 2 + elapsed * 1.0 + 1
        assert pub.stats["throttled"] >= 45
        busy = 0
        while flooder.poll(300):
            frames = flooder.recv_multipart()
            busy += frames[2] == b"\xff" * 8 and frames[3] == b""
        assert busy == pub.stats["throttled"]
    finally:
        flooder.close()
        pub.close()


def test_requests_beyond_the_request_rate_are_dropped_unanswered():
    pub = cached_publisher(n_blocks=100, replay_requests_per_s=1.0, replay_request_burst=5)
    asker = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        for _ in range(20):
            asker.send_multipart([b"", (0).to_bytes(8, "big")])
        assert wait_for(lambda: pub.stats["replays"] + pub.stats["throttled"] == 20)
        assert pub.stats["replays"] <= 6 and pub.stats["throttled"] >= 14
        answers = 0
        while asker.poll(200):
            answers += asker.recv_multipart()[-1] == b""  # one end marker per answered request
        assert answers == pub.stats["replays"]
    finally:
        asker.close()
        pub.close()


def test_answers_wait_while_the_byte_budget_is_spent():
    pub = cached_publisher(n_blocks=2000, replay_bytes_per_s=1000, replay_max_queued_bytes=1000)
    asker = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        asker.send_multipart([b"", (0).to_bytes(8, "big")])
        assert len(recv_until_end(asker)) > 1  # the first answer goes out whole (and leaves a debt)
        asker.send_multipart([b"", (0).to_bytes(8, "big")])
        assert wait_for(lambda: pub.stats["throttled"] == 1)
        assert not asker.poll(200)
    finally:
        asker.close()
        pub.close()


@pytest.mark.parametrize("bad", [{"snapshots_per_s": 0}, {"replay_max_queued_bytes": -1}])
def test_limits_must_be_positive(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_publisher(**bad)


def test_a_follower_converges_while_another_peer_floods_the_socket():
    pub = cached_publisher(n_blocks=500, snapshots_per_s=2.0, snapshot_burst=2)
    flooder = raw_socket(zmq.DEALER, pub.replay_endpoint)
    for _ in range(20):
        flooder.send_multipart([b"", SNAPSHOT_REQUEST])
    config = SubscriberConfig(replay_timeout=0.5, snapshot_timeout=0.5, recovery_backoff_max_s=0.5)
    f = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)], config).start()
    try:
        assert f.converges("r0", pub, timeout=10)
        assert f.sub.stats["r0"].snapshots == 1 and f.sub.stats["r0"].unrecovered == 0  # delayed, not lost
    finally:
        f.close()
        flooder.close()
        pub.close()
