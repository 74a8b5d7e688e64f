"""A nested section (the router's ``events``, the subscriber's ``SubscriberConfig``) is handed whole to its
component; users set it one level down in YAML, and the flags, variables and flat YAML keys they used
before still work (the flat key with a deprecation warning)."""

from __future__ import annotations

import argparse
import logging

import pytest
from kvmesh.cluster.config.loader import ConfigError, from_dict, load
from kvmesh.cluster.config.trees import ROUTER_SCHEMA, SERVE_SCHEMA
from kvmesh.events.config import SubscriberConfig


def test_the_router_events_section_is_the_subscribers_config():
    config = from_dict({"router": {"events": {"max_payload_bytes": 1 << 20, "replay_timeout": 0.5}}}, ROUTER_SCHEMA)
    assert config.router.events == SubscriberConfig(max_payload_bytes=1 << 20, replay_timeout=0.5)


def test_a_flat_key_of_before_still_loads_and_says_what_it_is_now(caplog):
    with caplog.at_level(logging.WARNING, logger="kvmesh.cluster.config.loader"):
        config = from_dict({"router": {"events_max_source_blocks": 5000}}, ROUTER_SCHEMA)
    assert config.router.events.max_source_blocks == 5000
    assert "router.events_max_source_blocks is deprecated, it is now router.events.max_source_blocks" in caplog.text


def test_flags_and_variables_keep_their_flat_names():
    from kvmesh.cluster.commands import router as command
    from kvmesh.cluster.config.flags import config_from_args

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["router", "--events-max-payload-bytes", "4096", "--events-max-lag-s", "2"])
    env = {"KVMESH_ROUTER_EVENTS_MAX_SOURCE_BLOCKS": "777"}
    router = config_from_args(args, ROUTER_SCHEMA, env=env).router
    assert (router.events.max_payload_bytes, router.events.max_source_blocks, router.events_max_lag_s) == (4096, 777, 2)


def test_a_bad_nested_value_names_its_key_flag_and_variable():
    with pytest.raises(ConfigError, match=r"router.events.max_payload_bytes \(--events-max-payload-bytes or "
                                          r"KVMESH_ROUTER_EVENTS_MAX_PAYLOAD_BYTES\): expected `int`"):
        from_dict({"router": {"events": {"max_payload_bytes": "big"}}}, ROUTER_SCHEMA)
    with pytest.raises(ConfigError, match="unknown key router.events.max_paylod_bytes .*did you mean "
                                          "'events.max_payload_bytes'"):
        from_dict({"router": {"events": {"max_paylod_bytes": 1}}}, ROUTER_SCHEMA)


def test_serve_refuses_the_keys_it_generates_under_either_name():
    for key in ({"events": {"curve_server_key": "x"}}, {"events_curve_server_key": "x"}):
        with pytest.raises(ConfigError, match="router.events.curve_server_key cannot be set in this command: serve "
                                              "generates"):
            from_dict({"router": key}, SERVE_SCHEMA)


def test_secrets_of_a_nested_section_are_redacted():
    from kvmesh.cluster.config.schema import to_dict

    config = load(ROUTER_SCHEMA, env={"KVMESH_ROUTER_EVENTS_CURVE_SECRET_KEY": "s" * 40,
                                      "KVMESH_ROUTER_EVENTS_CURVE_PUBLIC_KEY": "p" * 40})
    assert config.router.events.curve_secret_key == "s" * 40
    assert to_dict(config)["router"]["events"]["curve_secret_key"] == "<redacted>"


def test_a_snapshot_may_hold_a_whole_cache_of_max_source_blocks():
    assert SubscriberConfig().snapshot_bytes() == 128 << 20
    assert SubscriberConfig(max_source_blocks=2_000_000).snapshot_bytes() == 256_000_000
    assert SubscriberConfig(max_source_blocks=2_000_000, max_snapshot_bytes=1000).snapshot_bytes() == 1000
