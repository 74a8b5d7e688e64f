"""Endpoints follow vLLM's bind/connect rule; kvmesh's default listens on loopback only."""

import pytest
import zmq
from kvmesh.events.config import PublisherConfig
from kvmesh.events.endpoints import Endpoint, attach, offset_port, parse_pub_endpoint, parse_sub_endpoint
from kvmesh.events.publish.publisher import ZmqEventPublisher


@pytest.mark.parametrize(
    "endpoint, expected",
    [
        ("tcp://*:5557", Endpoint("tcp://*:5557", True)),
        ("tcp://[::]:5557", Endpoint("tcp://[::]:5557", True)),
        ("ipc:///tmp/kv.sock", Endpoint("ipc:///tmp/kv.sock", True)),
        ("inproc://kv", Endpoint("inproc://kv", True)),
        ("tcp://collector:5557", Endpoint("tcp://collector:5557", False)),
        ("tcp://127.0.0.1:5557", Endpoint("tcp://127.0.0.1:5557", False)),
        ("tcp://127.0.0.1:0", Endpoint("tcp://127.0.0.1:0", True)),  # ephemeral: only a bind has one
        ("bind://tcp://127.0.0.1:5557", Endpoint("tcp://127.0.0.1:5557", True)),
        ("connect://ipc:///tmp/kv.sock", Endpoint("ipc:///tmp/kv.sock", False)),
    ],
)
def test_pub_endpoint_follows_vllm_rule_and_explicit_prefixes(endpoint, expected):
    assert parse_pub_endpoint(endpoint) == expected


def test_subscriber_connects_unless_told_to_bind():
    assert parse_sub_endpoint("tcp://10.0.0.1:5557") == Endpoint("tcp://10.0.0.1:5557", False)
    assert parse_sub_endpoint("bind://tcp://127.0.0.1:0") == Endpoint("tcp://127.0.0.1:0", True)
    assert parse_sub_endpoint("tcp://*:6000").bind


def test_default_publisher_config_binds_loopback_only():
    config = PublisherConfig()
    assert parse_pub_endpoint(config.endpoint) == Endpoint("tcp://127.0.0.1:5557", True)
    assert config.replay_endpoint.startswith("tcp://127.0.0.1:")


def test_port_zero_binds_an_ephemeral_port_and_reports_it():
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUB)
    try:
        actual = attach(sock, parse_pub_endpoint("tcp://127.0.0.1:0"))
        host, port = actual.rsplit(":", 1)
        assert host == "tcp://127.0.0.1" and int(port) > 0
    finally:
        sock.close(linger=0)


def test_publisher_reports_resolved_endpoints():
    with ZmqEventPublisher(PublisherConfig(endpoint="bind://tcp://127.0.0.1:0",
                                           replay_endpoint="tcp://127.0.0.1:0")) as pub:
        assert pub.endpoint.startswith("tcp://127.0.0.1:") and not pub.endpoint.endswith(":0")
        assert pub.replay_endpoint.startswith("tcp://127.0.0.1:") and pub.replay_endpoint != pub.endpoint


def test_data_parallel_rank_offsets_fixed_ports_only():
    assert offset_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_port("bind://tcp://127.0.0.1:5557", 1) == "bind://tcp://127.0.0.1:5558"
    assert offset_port("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"
    assert offset_port("ipc:///tmp/x", 3) == "ipc:///tmp/x"


def test_config_rejects_nonsense_with_a_hint():
    with pytest.raises(ValueError, match="buffer_steps must be positive"):
        PublisherConfig(buffer_steps=0)
