"""The serve config: one tree of the components' own dataclasses; YAML, environment and flags derived
from their fields; clear rejection of unknown keys and bad values; secrets kept out of argv and output."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from kvmesh.cluster.config.flags import add_config_arguments, config_from_args
from kvmesh.cluster.config.loader import ConfigError, from_dict, load_config
from kvmesh.cluster.config.schema import REDACTED
from kvmesh.cluster.config.trees import SERVE_SCHEMA, ServeConfig
from kvmesh.events.config import PublisherConfig
from kvmesh.replica.config import EngineConfig
from kvmesh.router.config import RouterConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(parser, SERVE_SCHEMA)
    return parser


def _from_argv(argv: list[str], env: dict | None = None) -> ServeConfig:
    return config_from_args(_parser().parse_args(argv), SERVE_SCHEMA, env=env or {})


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return path


def test_sections_are_the_components_own_config_classes():
    config = load_config(env={})
    assert type(config.engine) is EngineConfig and type(config.router) is RouterConfig
    assert type(config.events) is PublisherConfig


def test_defaults_are_the_embedded_local_cluster():
    config = load_config(env={})
    assert config.is_embedded_model and config.is_embedded_ray
    assert config.replicas.num_replicas == 2 and config.router.port == 8000
    assert config.router.host == "auto"  # 127.0.0.1 on one machine, the node's IP in a cluster; never 0.0.0.0


def test_event_topic_defaults_to_vllms_empty_string():
    assert load_config(env={}).events.topic == ""
    assert _from_argv(["--topic", "kv"]).events.topic == "kv"


def test_stable_event_ports_follow_the_base_port():
    config = _from_argv(["--event-port", "6000", "--num-replicas", "3"])
    assert config.replicas.event_ports() == [(6000, 6001), (6002, 6003), (6004, 6005)]
    assert _from_argv(["--event-port", "0"]).replicas.event_ports() == [(0, 0), (0, 0)]


def test_yaml_values_are_loaded(tmp_path):
    path = _write(tmp_path, "engine: {model: /models/x, dtype: bfloat16, kv_cache_memory: 256MiB}\n"
                            "replicas: {num_replicas: 4}\nrouter: {policy_kwargs: {temperature: 0.5}}\n")
    config = load_config(path, env={})
    assert config.engine.model == "/models/x" and config.engine.dtype == "bfloat16"
    assert config.engine.kv_cache_memory == 256 * 2**20
    assert config.replicas.num_replicas == 4
    assert config.router.policy_kwargs == {"temperature": 0.5}


def test_flags_beat_env_beat_yaml(tmp_path):
    path = _write(tmp_path, "replicas: {num_replicas: 4}\nrouter: {port: 9000, max_attempts: 5}\n")
    env = {"KVMESH_ROUTER_PORT": "9100", "KVMESH_ENGINE_BLOCK_SIZE": "32"}
    config = _from_argv(["--config", str(path), "--num-replicas", "3", "--model", "m",
                         "--policy-kwargs", "temperature=2"], env)
    assert config.replicas.num_replicas == 3  # flag beats file
    assert config.router.port == 9100  # env beats file
    assert config.router.upstream.max_attempts == 5  # file beats default
    assert config.engine.model == "m" and config.engine.block_size == 32
    assert config.router.policy_kwargs == {"temperature": 2}


def test_router_settings_missing_from_the_old_serve_cli_are_flags_now():
    config = _from_argv(["--predict-ttl-s", "0.5", "--max-attempts", "1", "--no-enable-prefix-caching"])
    assert config.router.predict_ttl_s == 0.5 and config.router.upstream.max_attempts == 1
    assert config.engine.enable_prefix_caching is False


def test_flags_left_out_change_nothing():
    assert _from_argv([]) == ServeConfig()


def test_one_flag_per_field_and_no_duplicates():
    flags = [o.flag for o in SERVE_SCHEMA.options]
    assert len(flags) == len(set(flags))
    parser = _parser()
    for legacy in ("--policy-weight", "--policy-args", "-tp", "--set", "--replicas"):
        with pytest.raises(SystemExit):
            parser.parse_args([legacy, "1"])  # rejected, one name per idea


def test_unknown_nested_key_is_rejected_with_suggestion(tmp_path):
    path = _write(tmp_path, "replicas:\n  num_replica: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key replicas\.num_replica \(did you mean 'num_replicas'\?\)"):
        load_config(path, env={})


def test_unknown_section_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match=r"unknown section 'rooter' \(did you mean 'router'\?\)"):
        from_dict({"rooter": {"port": 1}})


def test_a_field_derived_from_another_section_says_where_to_set_it():
    with pytest.raises(ConfigError, match=r"router\.block_size cannot be set .*engine\.block_size"):
        from_dict({"router": {"block_size": 32}})


@pytest.mark.parametrize(("data", "message"), [
    ({"replicas": {"num_replicas": "two"}},
     r"replicas\.num_replicas \(--num-replicas or KVMESH_REPLICAS_NUM_REPLICAS\): expected `int`"),
    ({"replicas": {"num_replicas": 0}}, r"num_replicas=0 must be at least 1"),
    ({"engine": {"block_size": 0}}, r"block_size must be a positive integer"),
    ({"engine": {"kv_cache_memory": "lots"}}, r"kv_cache_memory='lots' is not a size"),
    ({"engine": {"dtype": "fp8"}}, r"dtype must be one of"),
    ({"router": {"port": 70000}}, r"port=70000 is not a TCP port"),
    ({"router": {"policy_kwargs": {"temperature": "high"}}}, r"temperature"),
    ({"engine": {"enable_prefix_caching": "maybe"}}, r"engine\.enable_prefix_caching .*expected `bool`"),
    ({"replicas": 3}, r"replicas must be a mapping"),
    ({"router": {"policy": "cache_awre"}}, r"unknown policy 'cache_awre' \(did you mean 'cache_aware'\?\)"),
    ({"router": {"policy_kwargs": {"temprature": 1}}},
     r"'temprature' is not an option of policy 'cache_aware_tokens' \(did you mean 'temperature'\?\)"),
    ({"engine": {"load_format": "safetensors"}}, r"cannot load the embedded model"),
    ({"router": {"port": 8100}}, r"router\.port and replicas\.http_port both use port 8100"),
    ({"router": {"api_key": "short"}}, r"api_key has 5 characters; use a secret of at least 8"),
])
def test_bad_values_are_rejected_with_the_path(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(data)


def test_every_help_example_is_accepted(monkeypatch):
    import shlex

    from kvmesh.cluster.commands.serve import __doc__ as help_text

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # examples name deploy/serve.example.yaml
    examples = [shlex.split(line.split("#")[0].split(">")[0])[2:] for line in help_text.splitlines()
                if line.strip().startswith("kvmesh serve ")]
    assert len(examples) == 5
    from kvmesh.cluster.cli import build_parser

    configs = [config_from_args(build_parser().parse_args(["serve", *argv]), SERVE_SCHEMA, env={})
               for argv in examples]
    assert configs[1].router.policy_kwargs == {"session_slack_s": 0.5, "temperature": 0.1}
    assert configs[0].replicas.num_replicas == 4 and configs[2].replicas.event_port == 0
    assert (configs[4].replicas.num_replicas, configs[4].replicas.num_prefill_replicas) == (2, 1)


def test_bad_yaml_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(_write(tmp_path, "engine: [unclosed\n"), env={})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", env={})


def test_secrets_come_from_env_and_are_never_shown():
    seed, key = "s" * 64, "k" * 32
    config = load_config(env={"KVMESH_HASH_SEED": seed, "KVMESH_API_KEY": key})
    assert config.engine.hash_seed == seed and config.router.api_key == key
    assert seed not in repr(config) and key not in repr(config)
    shown = config.to_dict()
    assert shown["engine"]["hash_seed"] == REDACTED and shown["router"]["api_key"] == REDACTED


def test_hash_seed_on_the_command_line_is_refused(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--hash-seed", "0123456789abcdef0123"])
    assert "KVMESH_HASH_SEED" in capsys.readouterr().err


def test_short_hash_seed_is_refused():
    with pytest.raises(ConfigError, match="hash_seed is shorter than 16"):
        load_config(env={"KVMESH_HASH_SEED": "short"})


def test_config_is_frozen():
    config = ServeConfig()
    with pytest.raises(AttributeError):
        config.replicas.num_replicas = 5  # type: ignore[misc]


def test_serve_gives_cache_aware_the_replicas_step_budget_unless_set():
    from kvmesh.router.routing.policies import with_step_budget as step_budget

    assert step_budget("cache_aware", {}, 2048) == {"decode_step_tokens": 2048}
    assert step_budget("cache_aware", {"decode_step_tokens": 512}, 2048) == {"decode_step_tokens": 512}
    assert step_budget("round_robin", {}, 2048) == {}
    RouterConfig(policy_kwargs=step_budget("cache_aware", {}, 2048))  # a valid option of the policy
