"""A replica given by its URL alone is followed at the event endpoints its ``/server_info`` advertises
(router/control/event_discovery.py): loopback and wildcard hosts become the URL's host, what is not a TCP endpoint
is ignored, and the registration as given still names the same replica."""

from __future__ import annotations

import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig
from kvmesh.router.control.event_discovery import advertised_spec
from kvmesh.router.control.runtime import RouterRuntime

INFO = {"events_endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"}


@pytest.mark.parametrize("advertised, reached", [
    ("tcp://127.0.0.1:5557", "tcp://10.0.0.7:5557"),
    ("tcp://localhost:5557", "tcp://10.0.0.7:5557"),
    ("tcp://0.0.0.0:5557", "tcp://10.0.0.7:5557"),
    ("tcp://*:5557", "tcp://10.0.0.7:5557"),
    ("tcp://[::1]:5557", "tcp://10.0.0.7:5557"),
    ("tcp://10.0.0.9:5557", "tcp://10.0.0.9:5557"),  # a routable address is the replica's own word
])
def test_a_loopback_or_wildcard_endpoint_is_reached_at_the_urls_host(advertised, reached):
    spec = advertised_spec(ReplicaSpec("http://10.0.0.7:8100"),
                           {"events_endpoint": advertised, "replay_endpoint": None})
    assert spec is not None and spec.events == reached and spec.replay is None
    assert spec.url == "http://10.0.0.7:8100" and spec.replica_id == "http://10.0.0.7:8100"


def test_both_endpoints_are_taken_and_the_rest_of_the_spec_kept():
    given = ReplicaSpec("http://127.0.0.1:8100", replica_id="r0", role="decode")
    spec = advertised_spec(given, INFO)
    assert (spec.events, spec.replay, spec.replica_id, spec.role) == ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558",
                                                                      "r0", "decode")


@pytest.mark.parametrize("info", [
    None, {}, {"events_endpoint": None}, {"events_endpoint": "ipc:///tmp/x"}, {"events_endpoint": "tcp://host"},
    {"events_endpoint": "tcp://host:notaport"}, {"events_endpoint": 5557}, {"events_endpoint": ["tcp://a:1"]},
    "not a dict",
])
def test_what_is_not_a_tcp_endpoint_advertises_nothing(info):
    assert advertised_spec(ReplicaSpec("http://127.0.0.1:8100"), info) is None


def test_a_replica_followed_at_its_advertised_events_is_the_same_registration_as_given():
    runtime = RouterRuntime(RouterConfig(port=0))
    given = ReplicaSpec("http://127.0.0.1:8100")
    first = runtime.add_replica(given)
    assert first.events_source == "none"
    runtime._follow_advertised(first, advertised_spec(given, INFO))
    followed = runtime.replicas.get(given.replica_id)
    assert first.removed and followed is not first
    assert followed.spec.events == "tcp://127.0.0.1:5557" and followed.events_source == "advertised"
    assert runtime.add_replica(given) is followed  # the owner's set says it again: nothing changes
    other = runtime.add_replica(ReplicaSpec("http://127.0.0.1:8100", events="tcp://127.0.0.1:6000"))
    assert other is not followed and other.events_source == "given"  # endpoints named by the operator win
