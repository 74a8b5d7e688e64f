"""The publisher speaks vLLM's PUB and replay protocol byte for byte, plus kvmesh snapshots."""

import time

import msgspec
import pytest
import zmq
from events_testkit import make_publisher, raw_socket, recv_until_end, stored, wait_for
from kvmesh.events.codec import decode_batch, encode_batch
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, KVEventBatch
from kvmesh.events.state import CachedBlockSet
from kvmesh.events.wire import END_SEQ, SNAPSHOT_REQUEST, SNAPSHOT_TAG


@pytest.fixture
def pub():
    p = make_publisher(topic="kv-events")
    yield p
    p.close()


def subscribed(pub) -> zmq.Socket:
    sub = raw_socket(zmq.SUB, pub.endpoint, subscribe=b"")
    # PUB drops until the subscription has arrived; the publisher says when it has.
    assert pub.wait_for_subscribers()
    return sub


def test_pub_frames_are_topic_seq_payload_with_seq_from_zero(pub):
    sub = subscribed(pub)
    try:
        batches = [KVEventBatch(ts=1.0 + i, events=[stored(i + 1, i or None)], data_parallel_rank=0) for i in range(3)]
        for b in batches:
            pub.publish(b)
        pub.publish([])  # empty batches are not sent and take no seq
        got = [sub.recv_multipart() for _ in range(3)]
        assert [f[0] for f in got] == [b"kv-events"] * 3
        assert [int.from_bytes(f[1], "big") for f in got] == [0, 1, 2]
        assert [f[2] for f in got] == [encode_batch(b) for b in batches]
        assert wait_for(lambda: pub.seq == 3)
        assert not sub.poll(100)
    finally:
        sub.close()


def test_publish_stamps_time_and_rank():
    p = make_publisher()
    sub = subscribed(p)
    try:
        p.publish([AllBlocksCleared()])
        batch = decode_batch(sub.recv_multipart()[2])
        assert batch.data_parallel_rank == 0 and abs(batch.ts - time.time()) < 5
    finally:
        sub.close()
        p.close()


def test_replay_answers_exactly_like_vllm(pub):
    for i in range(5):
        pub.publish([stored(i + 1, i or None)])
    assert wait_for(lambda: pub.seq == 5)
    dealer = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        dealer.send_multipart([b"", (3).to_bytes(8, "big")])
        answers = recv_until_end(dealer)
        assert [a[:3] for a in answers[:-1]] == [[b"", b"kv-events", (s).to_bytes(8, "big")] for s in (3, 4)]
        assert decode_batch(answers[0][3]).events == [stored(4, 3)]
        assert answers[-1] == [b"", b"", END_SEQ, b""]
    finally:
        dealer.close()


def test_replay_buffer_is_a_bounded_ring():
    p = make_publisher(buffer_steps=3)
    dealer = raw_socket(zmq.DEALER, p.replay_endpoint)
    try:
        for i in range(10):
            p.publish([stored(i + 1, None)])
        assert wait_for(lambda: p.seq == 10)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        answers = recv_until_end(dealer)
        assert [int.from_bytes(a[2], "big") for a in answers[:-1]] == [7, 8, 9]
    finally:
        dealer.close()
        p.close()


def test_snapshot_is_the_cached_set_tied_to_the_next_seq(pub):
    pub.publish([stored(1, None), stored(2, 1), stored(3, 2)])
    pub.publish([BlockRemoved(block_hashes=[3], medium="CPU"), stored(9, None)])
    assert wait_for(lambda: pub.seq == 2)
    dealer = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        dealer.send_multipart([b"", SNAPSHOT_REQUEST])
        answers = recv_until_end(dealer)
        assert all(a[1] == SNAPSHOT_TAG and a[2] == (2).to_bytes(8, "big") for a in answers)
        state = CachedBlockSet()
        for a in answers[:-1]:
            state.apply_all(decode_batch(a[3]).events)
        assert state.hashes() == {1, 2, 9}
    finally:
        dealer.close()


def test_snapshot_of_an_empty_publisher_is_empty_at_seq_zero(pub):
    dealer = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        dealer.send_multipart([b"", SNAPSHOT_REQUEST])
        assert recv_until_end(dealer) == [[b"", SNAPSHOT_TAG, (0).to_bytes(8, "big"), b""]]
    finally:
        dealer.close()


def test_snapshot_source_seeds_the_stream_as_batch_zero():
    seed = [stored(1, None), stored(2, 1)]
    p = make_publisher(snapshot_source=lambda: seed)
    dealer = raw_socket(zmq.DEALER, p.replay_endpoint)
    try:
        assert wait_for(lambda: p.seq == 1)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        first = decode_batch(recv_until_end(dealer)[0][3])
        assert first.events == [AllBlocksCleared(), *seed]
    finally:
        dealer.close()
        p.close()


def test_bad_requests_are_answered_or_ignored_without_harm(pub):
    dealer = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        dealer.send_multipart([b"", b"abc"])  # neither a seq nor a snapshot request
        assert recv_until_end(dealer) == [[b"", b"", END_SEQ, b""]]
        dealer.send_multipart([b"", b"x", b"y"])  # wrong frame count: ignored
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert recv_until_end(dealer)[-1] == [b"", b"", END_SEQ, b""]
        assert pub.stats["bad_requests"] == 2
    finally:
        dealer.close()


def test_overflow_with_a_snapshot_source_collapses_the_queue_into_one_resync():
    state = [stored(1, None)]
    p = make_publisher(snapshot_source=lambda: state, max_queue_size=2)
    p._io.stop()  # freeze the I/O thread so the queue fills
    p._thread.join(2)
    for i in range(5):
        p.publish([stored(i + 10, None)])
    assert len(p._queue) <= 2 and p.stats["resyncs"] >= 1
    assert p._queue[0].events[0] == AllBlocksCleared()
    p.close()


def test_close_is_clean_and_final():
    p = make_publisher()
    p.publish([stored(1, None)])
    p.close()
    p.close()
    assert not p._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        p.publish([stored(2, None)])


def test_u64_hashes_above_2_63_travel_unsigned(pub):
    sub = subscribed(pub)
    try:
        big = (1 << 64) - 5
        pub.publish([stored(big, (1 << 63) + 1)])
        raw = msgspec.msgpack.decode(sub.recv_multipart()[2])
        assert raw[1][0]["block_hashes"] == [big] and raw[1][0]["parent_block_hash"] == (1 << 63) + 1
    finally:
        sub.close()


def test_publish_never_waits_for_the_network():
    # vLLM's rule: a non-wildcard tcp address connects -- here to a port where nobody listens.
    p = make_publisher(endpoint="tcp://127.0.0.1:9")
    dealer = raw_socket(zmq.DEALER, p.replay_endpoint)
    try:
        t0 = time.perf_counter()
        for i in range(2000):
            p.publish([stored(i + 1, None)])
        # Blocked on the network, it would never end; the bound only ends the test then (2000 publishes take
        # a fraction of a CPU second, stretched many times on a loaded machine).
        assert time.perf_counter() - t0 < 60.0
        assert wait_for(lambda: p.seq == 2000)
        dealer.send_multipart([b"", (1999).to_bytes(8, "big")])  # still buffered for replay
        assert int.from_bytes(recv_until_end(dealer)[0][2], "big") == 1999
    finally:
        dealer.close()
        p.close()
