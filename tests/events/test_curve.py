"""Private event streams: with CURVE keys, a peer without them receives nothing; with them it
converges (every tenant's prompt was readable from the PUB and replay sockets)."""

import contextlib
import logging
import time

import pytest
import zmq
from events_testkit import Follower, make_publisher, raw_socket, stored, wait_for
from kvmesh.events import curve
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.wire import SNAPSHOT_REQUEST

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
FAST = dict(replay_timeout=0.5, snapshot_timeout=0.5)


@pytest.fixture
def server_keys():
    return curve.generate_keypair()


def publish_chain(pub, n):
    for h in range(1, n + 1):
        pub.publish([stored(h, h - 1 if h > 1 else None)])


def test_a_subscriber_with_the_key_converges(server_keys):
    public, secret = server_keys
    pub = make_publisher(curve_secret_key=secret)
    assert pub.curve_public_key == public
    f = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)],
                 SubscriberConfig(curve_server_key=public, **FAST)).start()
    try:
        publish_chain(pub, 10)  # before the subscription: found through the snapshot
        assert wait_for(lambda: f.sub.stats["r0"].snapshots >= 1)
        publish_chain(pub, 5)
        assert f.converges("r0", pub)
    finally:
        f.close()
        pub.close()


def test_a_peer_without_the_key_receives_nothing(server_keys):
    public, secret = server_keys
    pub = make_publisher(curve_secret_key=secret)
    plain_sub = raw_socket(zmq.SUB, pub.endpoint, subscribe=b"")
    plain_dealer = raw_socket(zmq.DEALER, pub.replay_endpoint)
    f = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)], SubscriberConfig(**FAST)).start()
    try:
        with contextlib.suppress(zmq.Again):  # no key, no handshake: the request may not even be queued
            plain_dealer.send_multipart([b"", SNAPSHOT_REQUEST], zmq.NOBLOCK)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            publish_chain(pub, 3)
            time.sleep(0.05)
        assert not plain_sub.poll(100) and not plain_dealer.poll(100)
        assert f.sub.stats["r0"].batches == 0 and f.states["r0"].hashes() == set()
        assert pub.stats["snapshots"] == 0 and pub.stats["replays"] == 0
    finally:
        f.close()
        plain_sub.close()
        plain_dealer.close()
        pub.close()


def test_an_allow_list_shuts_out_a_client_whose_key_is_not_on_it(server_keys):
    public, secret = server_keys
    allowed_pub, allowed_sec = curve.generate_keypair()
    pub = make_publisher(curve_secret_key=secret, curve_client_keys=(allowed_pub,))
    allowed = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)], SubscriberConfig(
        curve_server_key=public, curve_public_key=allowed_pub, curve_secret_key=allowed_sec, **FAST)).start()
    stranger = Follower([PublisherSource("r0", pub.endpoint, pub.replay_endpoint)],
                        SubscriberConfig(curve_server_key=public, **FAST)).start()  # a keypair of its own
    try:
        assert wait_for(lambda: allowed.sub.stats["r0"].snapshots >= 1)
        publish_chain(pub, 5)
        assert allowed.converges("r0", pub)
        assert stranger.sub.stats["r0"].batches == 0 and stranger.sub.stats["r0"].snapshots == 0
    finally:
        allowed.close()
        stranger.close()
        pub.close()


def test_keys_are_checked_without_showing_them():
    with pytest.raises(ValueError, match="40 characters") as err:
        make_publisher(curve_secret_key="not-a-key-but-a-secret")
    assert "not-a-key-but-a-secret" not in str(err.value)
    with pytest.raises(ValueError, match="curve_secret_key"):
        make_publisher(curve_client_keys=(curve.generate_keypair()[0],))


def test_plain_text_beyond_loopback_is_loud(caplog):
    with caplog.at_level(logging.WARNING, logger="kvmesh.events.curve"):
        assert not curve.warn_if_plain_beyond_loopback("tcp://127.0.0.1:5557", "PUB socket")
        assert not curve.warn_if_plain_beyond_loopback("tcp://[::1]:5557", "PUB socket")
        assert curve.warn_if_plain_beyond_loopback("tcp://*:5557", "PUB socket")
        assert curve.warn_if_plain_beyond_loopback("tcp://10.1.2.3:5558", "replay/snapshot socket")
    assert [r.getMessage().startswith("KV event PUB socket tcp://*:5557 is PLAIN TEXT") for r in caplog.records] == [
        True, False]
