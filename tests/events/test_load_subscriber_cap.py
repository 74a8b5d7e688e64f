"""Fake load subscribers cannot crowd a real router off a replica's load (events/publish/load_subscribers.py): a
stranger's requests are limited per peer address, in rate and in leases, and the subscriber cap is taken from the
address holding the most leases, so an address with one router keeps it however many others ask."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from events_testkit import make_publisher, wait_for
from kvmesh.events.load import ReplicaLoadUpdate
from kvmesh.events.publish import load_subscribers
from kvmesh.events.subscribe.load_feed import LoadFeed
from kvmesh.events.wire import LOAD_REQUEST

LEASE_S = 1.0
ATTACK_S = 3.0
FAKES = 200


def _update(seq: int) -> ReplicaLoadUpdate:
    return ReplicaLoadUpdate(ts=time.time(), seq=seq, num_running=1, num_waiting=0, queued_prefill_tokens=0,
                             kv_usage=0.1, accepted={}, epoch=3)


_FAKES = """
import sys, time, zmq
port, source, n, seconds, REQUEST = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5].encode()
socks = []
for _ in range(n):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10)
    sock.connect(f"tcp://{source}:0;127.0.0.1:{port}")
    socks.append(sock)
asked, deadline = 0, time.monotonic() + seconds
while time.monotonic() < deadline:
    for sock in socks:
        try:
            sock.send_multipart((b"", REQUEST), zmq.NOBLOCK)
            asked += 1
        except zmq.Again:
            pass
    time.sleep(0.001)
print(asked)
"""


def _fakes(endpoint: str, source: str) -> subprocess.Popen:
    """``FAKES`` DEALERs from ``source`` asking for the load as fast as they can for ``ATTACK_S``, never reading."""
    port = endpoint.rsplit(":", 1)[1]
    return subprocess.Popen([sys.executable, "-c", _FAKES, port, source, str(FAKES), str(ATTACK_S),
                             LOAD_REQUEST.decode()],
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sources", [["127.0.0.2"], [f"127.0.0.{k}" for k in range(2, 6)]])
def test_fake_subscribers_do_not_crowd_out_a_real_router(monkeypatch, sources):
    monkeypatch.setattr(load_subscribers, "MAX_LOAD_SUBSCRIBERS", 64)
    pub = make_publisher()
    pub._io.loads.lease_s = LEASE_S
    got: list[int] = []
    feed = LoadFeed(lambda name, u: got.append(u.seq), renew_s=LEASE_S / 3).start()
    feed.add_source("r0", pub.replay_endpoint)
    attackers: list[subprocess.Popen] = []
    try:
        seq = 0
        pub.publish_load(_update(seq))
        assert wait_for(lambda: got)
        attackers = [_fakes(pub.replay_endpoint, s) for s in sources]
        time.sleep(0.3)  # they connect
        start, held, samples = time.monotonic(), 0, 0
        loads = pub._io.loads
        while time.monotonic() - start < ATTACK_S - 0.5:
            seq += 1
            pub.publish_load(_update(seq))
            time.sleep(0.02)
            now = time.monotonic()
            held += any(end > now for end in dict(loads._held.get("127.0.0.1", {})).values())
            samples += 1
        leases = loads.count
        time.sleep(0.1)
        asked = sum(int(a.communicate(timeout=30)[0] or 0) for a in attackers)
        counts = feed.counters()["r0"]
        delivered = counts["updates"] + counts["throttled"] - 1  # frames read, the one before the attack apart
        print(f"{len(sources)} address(es), {asked} fake requests: the real router's lease ran {held / samples:.0%} "
              f"of the time, it read {delivered} of {seq} updates; {leases} leases; stats {pub.stats}")
        assert held >= 0.95 * samples
        assert delivered >= 0.7 * seq
        assert leases <= load_subscribers.MAX_LOAD_SUBSCRIBERS
    finally:
        for a in attackers:
            a.kill()
            a.wait(timeout=10)
        feed.close()
        pub.close()


class _Socket:
    def send_multipart(self, frames, flags=0) -> None:
        pass


def test_the_cap_gives_way_on_the_address_holding_the_most_and_each_address_is_limited(monkeypatch):
    monkeypatch.setattr(load_subscribers, "MAX_LOAD_SUBSCRIBERS", 8)
    subs, sock = load_subscribers.LoadSubscribers(), _Socket()
    assert subs.subscribe(sock, b"router", "10.0.0.1")
    for k in range(load_subscribers.ASK_BURST):
        assert subs.subscribe(sock, b"fake-%d" % k, "10.0.0.2" if k % 2 else "10.0.0.3")
    assert b"router" in subs._leases and subs.count == 8
    monkeypatch.setattr(load_subscribers, "MAX_LOAD_SUBSCRIBERS", 1024)
    many = load_subscribers.LoadSubscribers()
    for k in range(load_subscribers.ASK_BURST):
        many.subscribe(sock, b"fake-%d" % k, "10.0.0.2")
    assert many.count == load_subscribers.MAX_LEASES_PER_ADDRESS  # its own oldest gave way
    assert not many.subscribe(sock, b"one-more", "10.0.0.2")  # beyond its request budget: dropped, counted
    assert many.throttled == 1
    assert many.subscribe(sock, b"router", "10.0.0.1")  # another address's budget is its own
