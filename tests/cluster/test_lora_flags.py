"""`kvmesh replica`'s LoRA flags take vLLM's spelling: --enable-lora --lora-modules NAME=PATH (repeatable)."""

import argparse

from kvmesh.cluster.config import flags
from kvmesh.cluster.config.trees import REPLICA_SCHEMA


def replica_config(argv: list[str], env: dict[str, str] | None = None):
    parser = argparse.ArgumentParser()
    flags.add_config_arguments(parser, REPLICA_SCHEMA)
    return flags.config_from_args(parser.parse_args(["--model", "/m", *argv]), REPLICA_SCHEMA, env=env or {})


def test_lora_modules_take_name_equals_path_once_per_adapter():
    config = replica_config(["--enable-lora", "--lora-modules", "tiny=/a/tiny", "--lora-modules", "late=/a/late",
                             "--max-lora-rank", "8"])
    assert config.engine.lora_modules == {"tiny": "/a/tiny", "late": "/a/late"}
    assert config.engine.enable_lora and config.engine.max_lora_rank == 8


def test_lora_modules_and_the_admin_key_come_from_the_environment_too():
    config = replica_config(["--enable-lora"], {"KVMESH_ENGINE_LORA_MODULES": "a=/x,b=/y",
                                                "KVMESH_ADMIN_KEY": "admin-key-0001"})
    assert config.engine.lora_modules == {"a": "/x", "b": "/y"} and config.server.admin_key == "admin-key-0001"
