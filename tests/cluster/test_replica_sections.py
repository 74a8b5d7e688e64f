"""What serve hands each replica: its config sections whole, composed from the serve config."""

from __future__ import annotations

from dataclasses import replace

from kvmesh.cluster.config.loader import from_dict
from kvmesh.cluster.launch.event_keys import curve_keys
from kvmesh.cluster.launch.replica_sections import replica_events, replica_server


def test_replica_i_listens_on_the_base_ports_plus_i_and_2i_and_takes_only_the_internal_key():
    cfg = from_dict({"replicas": {"http_port": 9000, "event_port": 6000}, "router": {"api_key": "tenant-secret-key"}})
    server = replica_server(cfg, 2, "tiny", local=True, internal_key="cluster-internal-key")
    assert (server.host, server.port, server.event_port, server.replay_port) == ("127.0.0.1", 9002, 6004, 6005)
    assert server.router_only and server.served_model_name == "tiny"  # tenants only through the router
    assert server.internal_key == "cluster-internal-key" and "cluster-internal-key" not in repr(server)
    assert replica_server(cfg, 0, "tiny", local=False, internal_key=None).host == "auto"  # the node's address


def test_every_events_setting_reaches_the_replicas_and_private_streams_add_the_curve_keys():
    cfg = from_dict({"events": {"topic": "kv", "hwm": 123, "snapshot_burst": 9}})
    plain = replica_events(cfg, None)
    assert (plain.topic, plain.hwm, plain.snapshot_burst, plain.curve_secret_key) == ("kv", 123, 9, None)
    keys = curve_keys()
    private = replica_events(cfg, keys)
    assert private.curve_secret_key == keys.server_secret and private.curve_client_keys == (keys.router_public,)
    assert (private.topic, private.hwm) == ("kv", 123)
    assert keys.server_secret not in repr(keys) and keys.router_secret not in repr(keys)


def test_the_server_section_places_the_publisher():
    server = replica_server(from_dict({}), 0, "m", local=True, internal_key=None)
    events = server.publisher_config(from_dict({}).events)
    assert events.endpoint == "bind://tcp://127.0.0.1:5557" and events.replay_endpoint == "tcp://127.0.0.1:5558"
    assert replace(server, event_port=None).publisher_config(from_dict({}).events) is None
