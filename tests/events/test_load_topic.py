"""A replica's own load on its event stream (events/load.py): routers that ask get the latest at once and every
later update; vLLM-style consumers (a SUB on the empty topic, vLLM's replay requests) never see one; a private
stream's load reaches only the router that holds its key."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq
from events_testkit import make_publisher, raw_socket, stored, wait_for
from kvmesh.events import curve
from kvmesh.events.codec import decode_batch
from kvmesh.events.load import ReplicaLoadUpdate, decode_load_update, encode_load_update
from kvmesh.events.subscribe.load_feed import LoadFeed
from kvmesh.events.wire import END_SEQ, pack_seq, unpack_seq


def _update(seq: int, running: int = 1, **kw) -> ReplicaLoadUpdate:
    return ReplicaLoadUpdate(ts=time.time(), seq=seq, num_running=running, num_waiting=0, queued_prefill_tokens=64,
                             kv_usage=0.25, accepted={"router-a": seq}, **kw)


def test_the_message_round_trips_and_a_newer_replicas_extra_fields_are_ignored():
    update = _update(3, prefill_tokens_per_s=1e4, arrival_rate=0.5, recent_prefill=10.0, churn_tau_s=300.0)
    assert decode_load_update(encode_load_update(update)) == update
    newer = msgspec.msgpack.encode([*msgspec.msgpack.decode(encode_load_update(update)), "a field added later"])
    assert decode_load_update(newer) == update
    with pytest.raises(msgspec.ValidationError):
        decode_load_update(msgspec.msgpack.encode([1.0, "not a seq"]))


class _Loads:
    def __init__(self) -> None:
        self.got: list[ReplicaLoadUpdate] = []
        self.absent: list[str] = []


def _feed(pub, loads: _Loads, server_key: str | None = None, renew_s: float = 3.0) -> LoadFeed:
    feed = LoadFeed(lambda name, u: loads.got.append(u), loads.absent.append, renew_s=renew_s).start()
    feed.add_source("r0", pub.replay_endpoint, server_key)
    return feed


def test_a_late_router_gets_the_latest_load_then_every_update_and_vllm_consumers_see_none():
    pub = make_publisher()
    vllm_sub = raw_socket(zmq.SUB, pub.endpoint, subscribe=b"")  # vLLM's consumers: every topic
    assert pub.wait_for_subscribers(1)
    pub.publish_load(_update(0))
    pub.publish_load(_update(1, running=2))  # before any router asked: only the latest is kept
    loads = _Loads()
    feed = _feed(pub, loads)
    try:
        assert wait_for(lambda: len(loads.got) >= 1)
        assert loads.got[0].seq == 1 and loads.got[0].num_running == 2
        assert wait_for(lambda: pub.load_subscribers == 1)
        for seq in range(2, 6):
            pub.publish_load(_update(seq))
            pub.publish([stored(seq, None)])
        assert wait_for(lambda: loads.got[-1].seq == 5)
        got = []
        while vllm_sub.poll(300):
            got.append(vllm_sub.recv_multipart())
        assert [unpack_seq(seq) for _, seq, _ in got] == [0, 1, 2, 3]  # the KV batches, nothing else
        assert all(topic == b"" and decode_batch(payload).events for topic, _, payload in got)
        assert feed.bad_frames == 0 and loads.absent == []
    finally:
        feed.close()
        pub.close()


def test_vllms_replay_request_is_answered_as_before():
    pub = make_publisher()
    pub.publish_load(_update(0))
    for h in (1, 2):
        pub.publish([stored(h, None)])
    assert wait_for(pub.flushed)
    dealer = raw_socket(zmq.DEALER, pub.replay_endpoint)
    try:
        dealer.send_multipart([b"", pack_seq(0)])
        answers = []
        while dealer.poll(2000):
            frames = dealer.recv_multipart()
            answers.append(frames)
            if frames[2] == END_SEQ:
                break
        assert [unpack_seq(f[2]) for f in answers[:-1]] == [0, 1] and answers[-1][2] == END_SEQ
        assert all(f[1] == b"" for f in answers)  # vLLM's topic frame: no load answer among them
    finally:
        dealer.close(linger=0)
        pub.close()


def test_a_publisher_that_knows_no_load_request_is_told_apart():
    """A vLLM replay socket answers an unknown request with an end marker: the router keeps polling /load."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    loads = _Loads()
    feed = LoadFeed(lambda name, u: loads.got.append(u), loads.absent.append).start()
    feed.add_source("vllm", f"tcp://127.0.0.1:{port}")
    try:
        assert router.poll(5000)
        identity, _, request = router.recv_multipart()
        router.send_multipart([identity, b"", b"", END_SEQ, b""])  # vLLM: a start_seq beyond its end
        assert wait_for(lambda: loads.absent == ["vllm"])
        assert loads.got == []
    finally:
        feed.close()
        router.close(linger=0)


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_a_private_streams_load_reaches_only_the_router_with_its_key():
    public, secret = curve.generate_keypair()
    pub = make_publisher(curve_secret_key=secret)
    keyed, keyless = _Loads(), _Loads()
    with_key, without_key = _feed(pub, keyed, public), _feed(pub, keyless)
    try:
        deadline = time.monotonic() + 2.0
        seq = 0
        while time.monotonic() < deadline and not keyed.got:
            pub.publish_load(_update(seq))
            seq += 1
            time.sleep(0.05)
        assert keyed.got and keyed.got[-1].accepted == {"router-a": keyed.got[-1].seq}
        time.sleep(0.3)
        assert keyless.got == [] and without_key.updates == 0
    finally:
        with_key.close()
        without_key.close()
        pub.close()


def test_a_feed_with_no_source_waits_for_one_instead_of_spinning():
    pub = make_publisher()
    loads = _Loads()
    feed = LoadFeed(lambda name, u: loads.got.append(u), loads.absent.append)
    turns = []
    renew = feed._renew
    feed._renew = lambda: (turns.append(1), renew())[1]
    feed.start()
    try:
        time.sleep(0.5)
        assert len(turns) <= 10  # one turn per wait for a call, not a busy loop (zmq polls no socket at once)
        pub.publish_load(_update(7))
        feed.add_source("r0", pub.replay_endpoint)
        assert wait_for(lambda: loads.got and loads.got[-1].seq == 7)  # a source added meanwhile is taken at once
    finally:
        feed.close()
        pub.close()
