"""The serve config: YAML load, CLI overrides, clear rejection of unknown keys and bad values."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from kvmesh.cluster.config import REDACTED, ServeConfig
from kvmesh.cluster.config_cli import add_config_arguments, config_from_args
from kvmesh.cluster.config_loader import ConfigError, from_dict, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "serve.example.yaml"


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return parser.parse_args(argv)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return path


def test_defaults_are_the_embedded_local_cluster():
    config = load_config(env={})
    assert config.model.is_embedded and config.is_embedded_ray
    assert config.replicas.num_replicas == 2 and config.router.port == 8000
    assert config.router.host is None  # -> 127.0.0.1 locally, never 0.0.0.0


def test_example_config_in_deploy_loads():
    config = load_config(EXAMPLE, env={})
    assert config.cache.kv_cache_memory == 256 * 2**20
    assert config.router.policy == "cache_aware"


def test_yaml_values_are_loaded(tmp_path):
    path = _write(tmp_path, "model: {model: /models/x, dtype: bfloat16}\nreplicas: {num_replicas: 4}\n"
                            "router: {policy_weights: {decode_weight: 0.5}}\n")
    config = load_config(path, env={})
    assert config.model.model == "/models/x" and config.model.dtype == "bfloat16"
    assert config.replicas.num_replicas == 4
    assert config.router.policy_weights == {"decode_weight": 0.5}


def test_cli_flags_override_yaml(tmp_path):
    path = _write(tmp_path, "replicas: {num_replicas: 4}\nrouter: {port: 9000}\n")
    config = config_from_args(_args(["--config", str(path), "--replicas", "3", "--model", "m",
                                     "--policy-weight", "decode_weight=2", "--set", "cache.block_size=32"]))
    assert config.replicas.num_replicas == 3  # flag beats file
    assert config.router.port == 9000  # file beats default
    assert config.model.model == "m" and config.cache.block_size == 32
    assert config.router.policy_weights == {"decode_weight": 2}


def test_flags_left_out_change_nothing(monkeypatch):
    monkeypatch.delenv("KVMESH_HASH_SEED", raising=False)
    monkeypatch.delenv("KVMESH_API_KEY", raising=False)
    assert config_from_args(_args([])) == ServeConfig()


def test_unknown_nested_key_is_rejected_with_suggestion(tmp_path):
    path = _write(tmp_path, "replicas:\n  num_replica: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key replicas\.num_replica \(did you mean 'num_replicas'\?\)"):
        load_config(path, env={})


def test_unknown_section_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match=r"unknown key rooter \(did you mean 'router'\?\)"):
        from_dict({"rooter": {"port": 1}})


def test_unknown_set_path_is_rejected():
    with pytest.raises(ConfigError, match=r"unknown key cache\.blok_size \(did you mean 'block_size'\?\)"):
        config_from_args(_args(["--set", "cache.blok_size=32"]))


@pytest.mark.parametrize(("data", "message"), [
    ({"replicas": {"num_replicas": "two"}}, r"replicas\.num_replicas must be an integer, got 'two'"),
    ({"replicas": {"num_replicas": 0}}, r"num_replicas=0 must be at least 1"),
    ({"cache": {"block_size": 15}}, r"block_size=15 must be a positive power of two"),
    ({"cache": {"kv_cache_memory": "lots"}}, r"kv_cache_memory='lots' is not a size"),
    ({"model": {"dtype": "fp8"}}, r"model\.dtype='fp8'; expected one of auto, float32"),
    ({"router": {"port": 70000}}, r"router\.port=70000 is not a TCP port"),
    ({"router": {"policy_weights": {"decode_weight": "high"}}}, r"policy_weights must be a mapping"),
    ({"cache": {"enable_prefix_caching": "yes"}}, r"enable_prefix_caching must be true/false"),
    ({"replicas": 3}, r"replicas must be a mapping"),
    ({"router": {"policy": "cache_awre"}}, r"router\.policy='cache_awre' is not a routing policy \(did you mean 'cache_aware'\?\)"),
    ({"router": {"policy_weights": {"decode_weigth": 1}}}, r"decode_weigth is not an option of policy 'cache_aware' \(did you mean 'decode_weight'\?\)"),
    ({"model": {"model": "embedded", "load_format": "safetensors"}}, r"cannot load the embedded model"),
])
def test_bad_values_are_rejected_with_the_path(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(data)


def test_bad_yaml_names_the_file(tmp_path):
    path = _write(tmp_path, "model: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(path, env={})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", env={})


def test_secrets_come_from_env_and_are_never_shown():
    seed, key = "s" * 64, "k" * 32
    config = load_config(env={"KVMESH_HASH_SEED": seed, "KVMESH_API_KEY": key})
    assert config.cache.hash_seed == seed and config.router.api_key == key
    assert seed not in repr(config) and key not in repr(config)
    shown = config.to_dict()
    assert shown["cache"]["hash_seed"] == REDACTED and shown["router"]["api_key"] == REDACTED


def test_config_is_frozen():
    config = ServeConfig()
    with pytest.raises(AttributeError):
        config.replicas.num_replicas = 5  # type: ignore[misc]
