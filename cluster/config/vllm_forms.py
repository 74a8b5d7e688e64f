"""vLLM's spellings of a few flags, turned into kvmesh's fields.

``vllm serve MODEL`` takes the model as its positional argument; ``kvmesh serve MODEL`` and
``kvmesh replica MODEL`` do too (a ``--model`` that differs is an error, never a silent choice).
``--lora-modules`` takes several adapters after one flag, each ``NAME=PATH`` or vLLM's JSON object
``{"name": ..., "path": ..., "base_model_name": ...}``. A ``vllm serve`` flag kvmesh does not take is an error that
names what kvmesh does instead (``VLLM_ONLY_FLAGS``), not argparse's bare "unrecognized arguments"; one that means
nothing for kvmesh is accepted with a note (vllm_no_effect.py).
"""

from __future__ import annotations

import argparse
import json

from kvmesh.cluster.config.loader import ConfigError

MODEL_DEST = "model_positional"
SERVED_NAME_FIELD = "served_model_name"
"""Its flag takes several names, as vLLM's ``--served-model-name a b`` does (the config's list form)."""
_LORA_JSON_KEYS = {"name", "path", "base_model_name"}


VLLM_ONLY_FLAGS: dict[str, str] = {
    "--data-parallel-size": "each replica is its own engine behind the cache-aware router: use --num-replicas",
    "-dp": "each replica is its own engine behind the cache-aware router: use --num-replicas",
    "--pipeline-parallel-size": "kvmesh shards a model with tensor parallelism only: use --tensor-parallel-size",
    "-pp": "kvmesh shards a model with tensor parallelism only: use --tensor-parallel-size",
    "--kv-events-config": "every replica publishes KV events (vLLM's wire format): set --event-port / --topic",
    "--kv-transfer-config": "use --kv-transfer (and --kv-peer) to move KV blocks between replicas",
    "--enable-chunked-prefill": "prefills are always chunked: --max-num-batched-tokens sets the step's token budget",
    "--no-enable-chunked-prefill": "prefills are always chunked: --max-num-batched-tokens sets the step's token budget",
    "--enforce-eager": "use --no-cuda-graphs",
    "--num-gpu-blocks-override": "use --num-kv-blocks",
    "--swap-space": "use --kv-offload-memory (a host-memory tier of the prefix cache)",
    "--api-server-count": "use --workers (router processes serving the port)",
    "--enable-log-requests": "kvmesh logs no request's prompt or parameters; the router's --access-log writes a line "
                             "per request",
    "--enable-log-outputs": "kvmesh logs no outputs; the router's --access-log writes a line per request",
    "--distributed-executor-backend": "replicas and their tensor-parallel workers always run on Ray",
    "--prefix-caching-hash-algo": "blocks are hashed with xxh3_128 under the cluster's secret seed (KVMESH_HASH_SEED)",
    "--quantization": "not supported: weights load in --dtype",
    "-q": "not supported: weights load in --dtype",
    "--trust-remote-code": "not needed: kvmesh runs Llama-family models with its own code",
    "--tokenizer-mode": "not supported: the tokenizer is the model's Hugging Face tokenizer (--tokenizer to change it)",
    "--cpu-offload-gb": "not supported: weights stay on the device; --kv-offload-memory offloads KV blocks",
}
"""``vllm serve`` flags kvmesh does not take -> what kvmesh does instead (the error says it)."""


class _VLLMOnlyFlag(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is a vLLM flag kvmesh does not take; {VLLM_ONLY_FLAGS[option_string]}")


def refuse_vllm_only_flags(parser: argparse.ArgumentParser) -> None:
    """Make each of ``VLLM_ONLY_FLAGS`` the parser does not define an error naming kvmesh's way (``--x=v`` too)."""
    taken = set(parser._option_string_actions)  # noqa: SLF001 (argparse keeps no public list of its flags)
    for flag in VLLM_ONLY_FLAGS:
        if flag not in taken:
            parser.add_argument(flag, dest=f"vllm_only_{flag.lstrip('-').replace('-', '_')}", action=_VLLMOnlyFlag)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """The optional positional MODEL (vLLM's ``vllm serve MODEL``): the same as ``--model``."""
    parser.add_argument(MODEL_DEST, nargs="?", default=None, metavar="MODEL",
                        help="the model (a path or name), as in `vllm serve MODEL`; the same as --model")


def model_from_args(args: argparse.Namespace, flag_value: str | None) -> str | None:
    """The positional model merged with ``--model``'s value; a disagreement is a ConfigError."""
    positional = getattr(args, MODEL_DEST, None)
    if positional is None:
        return flag_value
    if flag_value is not None and flag_value != positional:
        raise ConfigError(f"the model is given twice and differs: {positional!r} (positional) and "
                          f"{flag_value!r} (--model); give one")
    return positional


def lora_items(items: list[str]) -> list[str]:
    """``--lora-modules`` values in vLLM's forms -> ``NAME=PATH`` items (the JSON form checked here)."""
    return [_lora_json(item) if item.lstrip().startswith("{") else item for item in items]


def _lora_json(item: str) -> str:
    try:
        spec = json.loads(item)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--lora-modules {item!r}: not valid JSON ({e.msg}); expected NAME=PATH or "
                          '{"name": ..., "path": ...}') from None
    if not isinstance(spec, dict):
        raise ConfigError(f"--lora-modules {item!r}: expected a JSON object with name and path")
    unknown = sorted(set(spec) - _LORA_JSON_KEYS)
    if unknown:
        raise ConfigError(f"--lora-modules {item!r}: unknown key(s) {', '.join(unknown)}; "
                          f"accepted: {', '.join(sorted(_LORA_JSON_KEYS))}")
    missing = [k for k in ("name", "path") if not isinstance(spec.get(k), str) or not spec[k]]
    if missing:
        raise ConfigError(f"--lora-modules {item!r}: {' and '.join(missing)} missing (a non-empty string each)")
    return f"{spec['name']}={spec['path']}"
