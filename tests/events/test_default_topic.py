"""By default a replica publishes on vLLM's default topic, the empty string: vllm-router's kv_aware
policy subscribes to exactly b"" and drops every other topic (DESIGN.md, KV events)."""

import zmq
from events_testkit import make_publisher, raw_socket, stored
from kvmesh.events.config import PublisherConfig
from kvmesh.events.schema import KVEventBatch
from kvmesh.replica.actor import ReplicaOptions
from kvmesh.replica.config import EngineConfig


def test_default_topics_are_vllms_empty_string():
    assert PublisherConfig().topic == ""
    assert ReplicaOptions(engine=EngineConfig(model="m")).events.topic == ""  # a replica's events section


def test_default_publisher_sends_the_empty_topic_frame():
    pub = make_publisher()
    sub = raw_socket(zmq.SUB, pub.endpoint, subscribe=b"")
    try:
        # PUB drops what it sends before the subscription has arrived: wait until it has
        assert pub.wait_for_subscribers()
        sent = 1
        pub.publish(KVEventBatch(ts=1.0, events=[stored(1, None)], data_parallel_rank=0))
        assert sub.poll(5000), "no batch arrived"
        topic, seq, _ = sub.recv_multipart()
        assert topic == b"" and 0 <= int.from_bytes(seq, "big") < sent
    finally:
        sub.close()
        pub.close()
