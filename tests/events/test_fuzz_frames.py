"""Fuzzing the event feed: random and mutated frames never escape the decoder or kill the feed.

The decoder half runs thousands of payloads offline (any failure must be ``DecodeError``); the
subscriber half sends generated frames over real loopback sockets from a hostile source while a
good publisher keeps publishing, and checks that the good source's state stays exact.
"""

import time

import msgspec
import pytest
from events_testkit import Follower, make_publisher, raw_publisher, stored, wait_for, wait_subscribed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvmesh.events.codec import DecodeError, check_batch, decode_batch_counted, encode_batch
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, KVEventBatch
from kvmesh.events.wire import SNAPSHOT_TAG

pytestmark = pytest.mark.slow  # hypothesis drives a live subscriber through thousands of frames (a minute on 2 cores)

GOOD = encode_batch(KVEventBatch(ts=1.0, events=[
    stored(7, None), stored(8, 7), BlockRemoved(block_hashes=[7], medium="CPU"), AllBlocksCleared(),
], data_parallel_rank=0))

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=40,
)


@st.composite
def mutated(draw, base: bytes = GOOD) -> bytes:
    """``base`` with a few bytes flipped, cut, or inserted."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(("flip", "cut", "insert")))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


def tagged(value) -> bytes:
    """A batch-shaped payload whose events are generated values (some with a real type tag)."""
    return msgspec.msgpack.encode([1.0, value if isinstance(value, list) else [value], 0])


payloads = (st.binary(max_size=2048) | mutated() | msgpack_values.map(msgspec.msgpack.encode)
            | msgpack_values.map(tagged)
            | st.fixed_dictionaries({"type": st.sampled_from(("BlockStored", "BlockRemoved")),
                                     "block_hashes": msgpack_values, "token_ids": msgpack_values,
                                     "block_size": msgpack_values, "parent_block_hash": msgpack_values,
                                     "medium": msgpack_values}).map(tagged))


def decode_or_reject(payload: bytes) -> None:
    try:
        check_batch(decode_batch_counted(payload).batch, max_blocks=1024)
    except DecodeError:
        pass


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads)
def test_the_decoder_raises_nothing_but_decode_error(payload):
    decode_or_reject(payload)


frames = st.lists(st.binary(max_size=64), min_size=1, max_size=4) | st.tuples(
    st.just(b"t"), st.binary(min_size=8, max_size=8), payloads).map(list)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(hostile=st.lists(frames, min_size=1, max_size=150), answers=st.lists(frames, max_size=30))
def test_hostile_frames_on_real_sockets_never_stop_the_feed_or_touch_a_good_source(hostile, answers):
    import zmq

    ctx = zmq.Context.instance()
    (pub, bad_ep), router = raw_publisher(), ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    bad_replay = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    good = make_publisher()
    # A second per request: an answer a loaded machine delays is not given up (the hostile source's go unanswered).
    config = SubscriberConfig(replay_timeout=1.0, snapshot_timeout=1.0, bad_frame_threshold=5)
    f = Follower([PublisherSource("bad", bad_ep, bad_replay),
                  PublisherSource("good", good.endpoint, good.replay_endpoint)], config).start()
    try:
        assert wait_for(lambda: f.sub.stats["good"].snapshots >= 1, timeout=15.0)
        assert good.wait_for_subscribers() and wait_subscribed(pub)
        for i, frame in enumerate(hostile):
            pub.send_multipart(frame)
            good.publish([stored(i + 1, i if i else None)])
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # answer the hostile source's requests with garbage
            if router.poll(20):
                identity = router.recv_multipart()[0]
                for frame in answers or [[b"", SNAPSHOT_TAG, b"abc", b""]]:
                    router.send_multipart([identity, *frame])
        assert f.converges("good", good)
        assert f.sub.feed_alive and f.sub.feed_restarts == 0
        assert f.sub.stats["good"].bad_frames == 0
    finally:
        f.close()
        good.close()
        pub.close()
        router.close()
