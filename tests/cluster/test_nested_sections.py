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
    assert (router.events.max_payload_bytes, router.events.max_source_blocks, router.events.max_lag_s) == (4096, 777, 2)


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


def test_the_router_sections_cut_from_flat_fields_keep_their_flat_keys_flags_and_variables(caplog):
    flat = {"pd_min_uncached_tokens": 64, "peer_pulls": False, "outlier_consecutive_failures": 1,
            "session_ttl_s": 30.0, "events_max_lag_s": 2.0, "max_attempts": 5, "forward_token_ids": False}
    with caplog.at_level(logging.WARNING, logger="kvmesh.cluster.config.loader"):
        router = from_dict({"router": flat}, ROUTER_SCHEMA).router
    assert (router.transfers.pd_min_uncached_tokens, router.transfers.peer_pulls, router.outliers.consecutive_failures,
            router.sessions.ttl_s, router.events.max_lag_s, router.upstream.max_attempts,
            router.tokenize.forward_token_ids) == (64, False, 1, 30.0, 2.0, 5, False)
    assert ("router.pd_min_uncached_tokens is deprecated, it is now router.transfers.pd_min_uncached_tokens"
            in caplog.text)
    assert "router.outlier_consecutive_failures is deprecated, it is now router.outliers.consecutive_failures" in (
        caplog.text)

    from kvmesh.cluster.commands import router as command
    from kvmesh.cluster.config.flags import config_from_args

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["router", "--pd-min-uncached-tokens", "64", "--outlier-base-ejection-s", "5",
                              "--session-ttl-s", "30", "--no-forward-token-ids", "--connect-timeout-s", "1"])
    env = {"KVMESH_ROUTER_PEER_PULL_OVERHEAD_S": "0.5", "KVMESH_ROUTER_OUTLIER_MAX_EJECTION_S": "60",
           "KVMESH_ROUTER_SESSION_TTL_S": "99", "KVMESH_ROUTER_MAX_ATTEMPTS": "2"}
    router = config_from_args(args, ROUTER_SCHEMA, env=env).router
    assert (router.transfers.pd_min_uncached_tokens, router.transfers.peer_pull_overhead_s,
            router.outliers.base_ejection_s, router.outliers.max_ejection_s, router.sessions.ttl_s,
            router.tokenize.forward_token_ids, router.upstream.connect_timeout_s,
            router.upstream.max_attempts) == (64, 0.5, 5.0, 60.0, 30.0, False, 1.0, 2)


def test_the_session_tables_size_is_not_a_setting():
    with pytest.raises(ConfigError, match="router.sessions.max_sessions cannot be set in this command"):
        from_dict({"router": {"sessions": {"max_sessions": 5}}}, ROUTER_SCHEMA)
