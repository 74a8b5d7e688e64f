"""CLI flags of ``kvmesh serve`` that override the serve config (YAML < env < flags).

Each flag maps to one dotted config path; flags left out change nothing. ``--set
section.key=value`` reaches every other field. Secrets have no flag of their own except
``--api-key`` (argv is visible to every user of the machine; prefer KVMESH_API_KEY); the hash
seed only comes from YAML or KVMESH_HASH_SEED.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvmesh.cluster.config import ServeConfig
from kvmesh.cluster.config_loader import ConfigError, load_config, parse_assignment

# (flags, dotted path, argparse kwargs)
FLAGS: tuple[tuple[tuple[str, ...], str, dict[str, Any]], ...] = (
    (("--model",), "model.model", {"help": "HF id, local directory, or 'embedded' (default: a tiny random Llama)"}),
    (("--tokenizer",), "model.tokenizer", {"help": "tokenizer id or directory (default: the model's)"}),
    (("--served-model-name",), "model.served_model_name", {"help": "model name clients send"}),
    (("--dtype",), "model.dtype", {"help": "auto, float32, bfloat16, float16"}),
    (("--load-format",), "model.load_format", {"help": "auto, safetensors, dummy"}),
    (("--max-model-len",), "model.max_model_len", {"type": int, "help": "context length in tokens"}),
    (("--block-size",), "cache.block_size", {"type": int, "help": "tokens per KV block (default 16)"}),
    (("--kv-cache-memory",), "cache.kv_cache_memory", {"help": "KV cache per replica on CPU, e.g. 256MiB"}),
    (("--gpu-memory-utilization",), "cache.gpu_memory_utilization", {"type": float}),
    (("--no-prefix-caching",), "cache.enable_prefix_caching",
     {"action": "store_const", "const": False, "help": "disable prefix caching"}),
    (("--replicas", "--num-replicas"), "replicas.num_replicas", {"type": int, "help": "replicas (default 2)"}),
    (("--tensor-parallel-size", "-tp"), "replicas.tensor_parallel_size", {"type": int, "help": "workers per replica"}),
    (("--device",), "replicas.device", {"help": "auto, cpu, cuda"}),
    (("--max-num-seqs",), "replicas.max_num_seqs", {"type": int}),
    (("--max-restarts",), "replicas.max_restarts", {"type": int, "help": "Ray restarts of a dead replica"}),
    (("--policy",), "router.policy", {"help": "routing policy (default cache_aware)"}),
    (("--host",), "router.host", {"help": "router bind address (default 127.0.0.1 locally, node IP in a cluster)"}),
    (("--port",), "router.port", {"type": int, "help": "router HTTP port (default 8000)"}),
    (("--api-key",), "router.api_key", {"help": "require this bearer token (prefer KVMESH_API_KEY)"}),
    (("--address",), "ray.address", {"help": "Ray cluster to join ('auto' or host:port); default: start a local one"}),
    (("--num-cpus",), "ray.num_cpus", {"type": int, "help": "logical CPUs of the embedded Ray instance"}),
    (("--placement",), "ray.placement", {"help": "spread (default) or pack"}),
)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", metavar="FILE", help="serve config YAML (see deploy/serve.example.yaml)")
    group = parser.add_argument_group("config overrides (beat the YAML file)")
    for flags, dotted, kwargs in FLAGS:
        if "action" not in kwargs:
            kwargs = {"metavar": dotted.rsplit(".", 1)[-1].upper(), **kwargs}
        group.add_argument(*flags, dest=_dest(dotted), default=argparse.SUPPRESS, **kwargs)
    group.add_argument("--policy-weight", action="append", default=[], metavar="NAME=VALUE",
                       help="a routing policy weight, e.g. --policy-weight load_weight=0.5 (repeatable)")
    group.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="set_values",
                       help="override any config field, e.g. --set replicas.max_num_seqs=64 (repeatable)")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The dotted-path overrides the user gave on the command line, in precedence order."""
    overrides: dict[str, Any] = {}
    for text in getattr(args, "set_values", []):
        dotted, value = parse_assignment(text)
        overrides[dotted] = value
    for _, dotted, _ in FLAGS:
        if hasattr(args, _dest(dotted)):
            overrides[dotted] = getattr(args, _dest(dotted))
    for text in getattr(args, "policy_weight", []):
        name, value = parse_assignment(text)
        overrides[f"router.policy_weights.{name}"] = value
    if "cache.kv_cache_memory" in overrides and str(overrides["cache.kv_cache_memory"]).isdigit():
        overrides["cache.kv_cache_memory"] = int(overrides["cache.kv_cache_memory"])
    return overrides


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """YAML (``--config``) + environment + flags -> ``ServeConfig``; raises ``ConfigError``."""
    return load_config(getattr(args, "config", None), overrides_from_args(args))


def _dest(dotted: str) -> str:
    return "cfg__" + dotted.replace(".", "__")


__all__ = ["ConfigError", "add_config_arguments", "config_from_args", "overrides_from_args"]
