"""Router configuration: the --replica spec, validation, and the CLI parser."""

from __future__ import annotations

import argparse

import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig


def test_replica_spec_parses_events_replay_and_name():
    spec = ReplicaSpec.parse("http://10.0.0.5:8100/v1,events=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,name=r0")
    assert spec == ReplicaSpec("http://10.0.0.5:8100", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", "r0")


def test_replica_spec_defaults_its_id_to_the_url():
    spec = ReplicaSpec.parse("http://127.0.0.1:8100/")
    assert spec.replica_id == "http://127.0.0.1:8100" and spec.events is None


@pytest.mark.parametrize("text, fragment", [
    ("127.0.0.1:8100", "http://"),
    ("http://h:1,events=5557", "tcp://"),
    ("http://h:1,color=red", "bad replica option"),
])
def test_bad_replica_spec_says_what_to_write(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        ReplicaSpec.parse(text)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"policy": "fastest"}, "unknown policy"),
    ({"port": 70000}, "port"),
    ({"block_size": 0}, "block_size"),
    ({"upstream": {"max_attempts": 0}}, "max_attempts"),
    ({"api_key": ""}, "api_key"),
    ({"api_key": "1234567"}, "at least 8"),
    ({"policy_kwargs": {"temprature": 1}}, "did you mean 'temperature'"),
])
def test_router_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        RouterConfig(**{k: UpstreamConfig(**v) if k == "upstream" else v for k, v in kwargs.items()})


def test_router_config_binds_loopback_by_default():
    assert RouterConfig().host == "127.0.0.1"


def test_cli_parses_a_standalone_router():
    from kvmesh.cluster.commands import router as command
    from kvmesh.cluster.config.flags import config_from_args
    from kvmesh.cluster.config.trees import ROUTER_SCHEMA

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args([
        "router", "--replica", "http://127.0.0.1:8100,events=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558",
        "--replica", "http://127.0.0.1:8101", "--policy", "prefix_hash", "--port", "9000",
        "--api-key", "k" * 8, "--model", "some/model", "--predict-ttl-s", "0.5", "--policy-kwargs", "prefix_blocks=2"])
    config = config_from_args(args, ROUTER_SCHEMA, env={}).router
    assert args.func is command.run and len(args.replica) == 2
    assert (config.host, config.port, config.policy, config.api_key) == ("127.0.0.1", 9000, "prefix_hash", "k" * 8)
    assert config.predict_ttl_s == 0.5 and config.policy_kwargs == {"prefix_blocks": 2}


def test_router_and_serve_share_the_api_key_rule(capsys):
    from kvmesh.cluster.cli import main

    assert main(["router", "--api-key", "short"]) == 2
    assert "at least 8" in capsys.readouterr().err
    assert main(["serve", "--api-key", "short", "--print-config"]) == 2
    assert "at least 8" in capsys.readouterr().err


def test_cli_reports_a_bad_replica_spec_without_a_traceback(capsys):
    from kvmesh.cluster.commands import router as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["router", "--replica", "localhost:8100"])
    assert command.run(args) == 2
    assert "http://" in capsys.readouterr().err


def test_router_command_reads_the_router_section_from_yaml_and_env(tmp_path):
    from kvmesh.cluster.config.loader import load
    from kvmesh.cluster.config.trees import ROUTER_SCHEMA

    path = tmp_path / "router.yaml"
    path.write_text("router:\n  policy: round_robin\n  max_attempts: 5\n")
    config = load(ROUTER_SCHEMA, path, env={"KVMESH_ROUTER_MAX_ATTEMPTS": "2", "KVMESH_API_KEY": "k" * 12}).router
    assert config.policy == "round_robin" and config.upstream.max_attempts == 2 and config.api_key == "k" * 12


def test_the_router_is_built_from_its_section_whole():
    from kvmesh.router.config import build_router
    from kvmesh.router.routing.policies.prefix_hash import PrefixHashConfig
    from kvmesh.router.routing.session import SessionConfig

    config = RouterConfig(block_size=32, policy="prefix_hash", policy_kwargs={"prefix_blocks": 2},
                          predict_ttl_s=0.25, sessions=SessionConfig(ttl_s=30.0),
                          cache_salt_secret=b"k" * 32)
    router = build_router(config, seed=7)
    assert (router.block_size, router.hasher.seed, router.hasher.salt_secret) == (32, 7, b"k" * 32)
    assert router.policy.config == PrefixHashConfig(prefix_blocks=2) and router.policy.block_size == 32
    assert (router.index.predict_ttl_s, router.sessions.config.ttl_s) == (0.25, 30.0)


def test_the_runtime_hands_the_events_section_to_its_subscriber_whole():
    from kvmesh.router.control.runtime import RouterRuntime

    config = RouterConfig(block_size=16)
    config.events.max_source_blocks = 5000
    runtime = RouterRuntime(config)
    try:
        assert runtime.subscriber_config is config.events
    finally:
        runtime.renderer.close()


def test_router_config_keeps_its_settings_in_sections():
    """At most 27 top-level fields; what a component uses is a section handed to it whole."""
    import dataclasses

    from kvmesh.events.config import SubscriberConfig
    from kvmesh.router.routing.kv_placement import KVPlacementRules
    from kvmesh.router.routing.outlier import OutlierConfig
    from kvmesh.router.routing.session import SessionConfig

    assert len(dataclasses.fields(RouterConfig)) <= 27, [f.name for f in dataclasses.fields(RouterConfig)]
    sections = {f.name: f.type for f in dataclasses.fields(RouterConfig)}
    assert {"transfers", "outliers", "sessions", "events"} <= set(sections)
    config = RouterConfig()
    assert (type(config.transfers), type(config.outliers), type(config.sessions), type(config.events)) == (
        KVPlacementRules, OutlierConfig, SessionConfig, SubscriberConfig)
