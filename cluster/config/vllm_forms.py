"""vLLM's spellings of a few flags, turned into kvmesh's fields.

``vllm serve MODEL`` takes the model as its positional argument; ``kvmesh serve MODEL`` and
``kvmesh replica MODEL`` do too (a ``--model`` that differs is an error, never a silent choice).
``--lora-modules`` takes several adapters after one flag, each ``NAME=PATH`` or vLLM's JSON object
``{"name": ..., "path": ..., "base_model_name": ...}``. What kvmesh does with each other ``vllm serve`` flag is
vllm_flags.py's table (vllm_habits.py applies it).
"""

from __future__ import annotations

import argparse
import json

from kvmesh.cluster.config.loader import ConfigError

MODEL_DEST = "model_positional"
SERVED_NAME_FIELD = "served_model_name"
"""Its flag takes several names, as vLLM's ``--served-model-name a b`` does (the config's list form)."""
_LORA_JSON_KEYS = {"name", "path", "base_model_name"}


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
