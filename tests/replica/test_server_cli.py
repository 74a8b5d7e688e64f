"""``kvmesh replica`` parses its flags into an EngineConfig and the runtime's options."""

from __future__ import annotations

from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.commands.replica import engine_config_from_args


def parse(*argv: str):
    return build_parser().parse_args(["replica", "--model", "some/model", *argv])


def test_defaults_follow_design_ports_and_loopback(monkeypatch):
    monkeypatch.delenv("KVMESH_API_KEY", raising=False)
    args = parse()
    assert (args.host, args.port, args.event_port, args.replay_port) == ("127.0.0.1", 8100, 5557, 5558)
    assert args.tp == 1 and args.api_key is None
    config = engine_config_from_args(args)
    assert config.tensor_parallel_size == 1 and config.kv_events_endpoint is None  # the runtime binds events


def test_flags_reach_the_engine_config():
    args = parse("--tp", "2", "--block-size", "32", "--max-model-len", "256", "--no-prefix-caching",
                 "--events-endpoint", "connect://tcp://collector:5557", "--replay-port", "6000")
    config = engine_config_from_args(args)
    assert config.tensor_parallel_size == 2 and config.block_size == 32 and config.max_model_len == 256
    assert config.enable_prefix_caching is False
    assert config.kv_events_endpoint == "connect://tcp://collector:5557"
    assert config.kv_events_replay_endpoint == "tcp://127.0.0.1:6000"


def test_api_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVMESH_API_KEY", "from-env-secret")
    assert parse().api_key == "from-env-secret"
