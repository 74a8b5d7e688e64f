"""One source cannot take the subscriber from the others: frames that are expensive to decode
are refused by their msgpack headers before any decoding, every source's decode and apply work is
charged to it and bounded, sockets take turns, and the flooding source is the one degraded."""

import threading

import msgspec
import pytest
from events_testkit import Follower, RawSource, make_publisher, stored, wait_for, wait_subscribed
from kvmesh.events.codec import decode_batch, encode_batch
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.peek import ShapeError, peek_batch
from kvmesh.events.schema import BlockRemoved, BlockStored, KVEventBatch
from kvmesh.events.subscribe import frame_guard

ENC = msgspec.msgpack.Encoder()
LISTS = 1_000_000
TS = b"\xcb" + b"\0" * 8

EXPENSIVE = {  # each costs ~0.5-1.5 s and up to ~300 MB to decode in full
    "arrays nested where events belong": b"\x93" + TS + b"\xdd" + LISTS.to_bytes(4,
                                                                                 "big") + b"\x91\x90" * LISTS + b"\0",
    "arrays nested a million deep": b"\x93" + TS + b"\x91" * LISTS + b"\x90" + b"\0",
    "a batch of 200,000 events": ENC.encode([0.0, [{"type": "AllBlocksCleared"}] * 200_000, 0]),
    "200,000 positional events": ENC.encode([0.0, [["BlockRemoved", [b"\0" * 8], "GPU"]] * 200_000, 0]),
    "lists where block hashes belong": ENC.encode([0.0, [{"type": "BlockRemoved", "block_hashes": [[]] * LISTS}], 0]),
    "extra_keys wider than any batch": ENC.encode([0.0, [{"type": "BlockStored", "block_hashes": [1],
                                                          "extra_keys": [[]] * LISTS}], 0]),
}


def seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


@pytest.mark.parametrize("shape", sorted(EXPENSIVE))
def test_the_headers_refuse_each_expensive_shape(shape):
    with pytest.raises(ShapeError):
        peek_batch(EXPENSIVE[shape], max_events=65_536, max_blocks=65_536)


def test_the_headers_pass_every_valid_encoding():
    stored_event = BlockStored(block_hashes=list(range(1, 65_537)), parent_block_hash=None,
                               token_ids=[7] * 65_536 * 16, block_size=16, lora_id=None, medium="GPU",
                               lora_name=None, extra_keys=[["salt"]] + [None] * 65_535)
    valid = [
        encode_batch(KVEventBatch(ts=1.0, events=[stored_event])),
        encode_batch(KVEventBatch(ts=1.0, events=[BlockRemoved(block_hashes=[1, 2], medium=None)] * 1000)),
        ENC.encode([1.0, [["BlockRemoved", [b"\0" * 7 + b"\1"], "GPU"]] * 1000]),  # positional, bytes hashes
        ENC.encode([1, [{"type": "SomethingNew", "x": [[1, 2]]}], 0]),  # an unknown event type
    ]
    for payload in valid:
        peek_batch(payload, max_events=65_536, max_blocks=65_536)
        decode_batch(payload)


def test_a_subscriber_refuses_expensive_frames_without_decoding_them(monkeypatch):
    decoded = []
    real = frame_guard.decode_batch_counted
    monkeypatch.setattr(frame_guard, "decode_batch_counted", lambda p, *a: decoded.append(len(p)) or real(p, *a))
    raw = RawSource()
    config = SubscriberConfig(snapshot_on_start=False, idle_probe_interval=None, bad_frame_threshold=100)
    f = Follower([PublisherSource("raw", raw.endpoint)], config).start()
    try:
        assert wait_subscribed(raw.pub)
        raw.pub.send_multipart([b"", seq(0), encode_batch(KVEventBatch(ts=0.0, events=[stored(1, None)]))])
        assert wait_for(lambda: f.sub.stats["raw"].batches == 1)
        decoded.clear()
        for n, shape in enumerate(sorted(EXPENSIVE), start=1):
            raw.pub.send_multipart([b"", seq(n), EXPENSIVE[shape]])
        assert wait_for(lambda: f.sub.stats["raw"].shape_refusals == len(EXPENSIVE), timeout=10)
        assert decoded == []  # refused by their headers, none decoded
        st = f.sub.stats["raw"]
        assert st.decode_errors == len(EXPENSIVE) and st.batches == 1 and f.sub.feed_alive
    finally:
        f.close()
        raw.close()


def _flood(raw: RawSource, payload: bytes, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                raw.pub.send_multipart([b"", seq(n), payload], copy=False)
            except Exception:
                return
            stop.wait(0.001)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_honest_source_is_applied_while_another_floods_with_costly_batches():
    """The flooder's batches are valid and each costs the consumer 20 ms to apply: before, each turn read
    512 of them (10 s) before the honest socket's turn came."""
    raw, good, stop = RawSource(), make_publisher(), threading.Event()
    config = SubscriberConfig(snapshot_on_start=False, idle_probe_interval=None)
    applied = {"flood": 0, "good": 0}

    def on_batch(name, _seq, _batch) -> None:
        applied[name] += 1
        if name == "flood":
            stop.wait(0.02)  # an expensive apply

    from kvmesh.events.subscribe.subscriber import EventSubscriber

    sub = EventSubscriber([PublisherSource("flood", raw.endpoint), PublisherSource("good", good.endpoint)],
                          on_batch=on_batch, config=config).start()
    flooder = None
    try:
        assert good.wait_for_subscribers() and wait_subscribed(raw.pub)
        flooder = _flood(raw, encode_batch(KVEventBatch(ts=0.0, events=[stored(1, None)])), stop)
        assert wait_for(lambda: applied["flood"] >= 20)  # the flood is being applied
        for h in range(1, 11):
            good.publish([stored(h, h - 1 if h > 1 else None)])
        assert wait_for(lambda: applied["good"] >= 10, timeout=5)
        assert not stop.is_set() and flooder.is_alive()  # while it floods
        assert sub.stats["flood"].busy_pauses >= 1  # over its share of the thread: left unread a while
        assert sub.stats["good"].busy_pauses == 0 and sub.stats["good"].bad_frames == 0
    finally:
        stop.set()
        if flooder is not None:
            flooder.join(2)
        sub.close()
        raw.close()
        good.close()


def test_the_flooding_source_is_degraded_and_the_honest_one_is_not():
    raw, good, stop = RawSource(), make_publisher(), threading.Event()
    config = SubscriberConfig(snapshot_on_start=False, idle_probe_interval=None)
    f = Follower([PublisherSource("flood", raw.endpoint), PublisherSource("good", good.endpoint)], config).start()
    flooder = None
    try:
        assert good.wait_for_subscribers() and wait_subscribed(raw.pub)
        flooder = _flood(raw, EXPENSIVE["a batch of 200,000 events"], stop)
        assert wait_for(lambda: ("flood", "degraded") in f.statuses)
        for h in range(1, 6):
            good.publish([stored(h, h - 1 if h > 1 else None)])
        assert wait_for(lambda: f.sub.stats["good"].batches >= 5)
        assert ("good", "degraded") not in f.statuses and f.sub.stats["good"].bad_frames == 0
        assert f.sub.stats["flood"].shape_refusals >= config.bad_frame_threshold
    finally:
        stop.set()
        if flooder is not None:
            flooder.join(2)
        f.close()
        raw.close()
        good.close()


def test_sources_sharing_a_bound_socket_get_their_share_too():
    """Publishers that connect to one bound socket cannot be left unread one by one: a source over its
    share has its messages dropped unread instead, and the others' are applied."""
    import zmq

    stop = threading.Event()
    applied = {"flood": 0, "good": 0}

    def on_batch(name, _seq, _batch) -> None:
        applied[name] += 1
        if name == "flood":
            stop.wait(0.02)

    from kvmesh.events.subscribe.subscriber import EventSubscriber

    sources = [PublisherSource(t, "bind://tcp://127.0.0.1:0", topic=t) for t in ("flood", "good")]
    sub = EventSubscriber(sources, on_batch=on_batch, config=SubscriberConfig(snapshot_on_start=False,
                                                                              idle_probe_interval=None)).start()
    flood_pub = zmq.Context.instance().socket(zmq.XPUB)
    flood_pub.setsockopt(zmq.LINGER, 0)
    good, thread = None, None
    try:
        assert wait_for(lambda: sub.bound_endpoint("flood") is not None)
        address = sub.bound_endpoint("flood")
        flood_pub.connect(address)
        good = make_publisher(endpoint=address, topic="good", replay_endpoint=None)
        assert good.wait_for_subscribers() and wait_subscribed(flood_pub)
        payload = encode_batch(KVEventBatch(ts=0.0, events=[stored(1, None)]))

        def run() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                flood_pub.send_multipart([b"flood", seq(n), payload], copy=False)
                stop.wait(0.001)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert wait_for(lambda: applied["flood"] >= 20)
        for h in range(1, 11):
            good.publish([stored(h, h - 1 if h > 1 else None)])
        assert wait_for(lambda: applied["good"] >= 10, timeout=5)
        assert sub.stats["flood"].busy_pauses >= 1 and sub.stats["good"].busy_pauses == 0
        assert thread.is_alive() and sub.feed_alive
    finally:
        stop.set()
        if thread is not None:
            thread.join(2)
        sub.close()
        flood_pub.close()
        if good is not None:
            good.close()
