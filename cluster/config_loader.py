"""Build a ``ServeConfig`` from YAML, the environment and CLI overrides, with errors for people.

Precedence, lowest first: dataclass defaults < YAML file < environment (secrets only:
KVMESH_HASH_SEED, KVMESH_API_KEY) < CLI flags / ``--set section.key=value``.

Unknown keys are rejected at any depth with a "did you mean" suggestion; values of the wrong
type are rejected with the dotted path, the expected type and the value; the sections'
``__post_init__`` checks (ranges, choices) are reported with the file they came from.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kvmesh.cluster.config import ServeConfig
from kvmesh.cluster.config_checks import did_you_mean

# environment variable -> dotted config path (secrets stay out of argv, which `ps` shows)
ENV_OVERRIDES = {"KVMESH_HASH_SEED": "cache.hash_seed", "KVMESH_API_KEY": "router.api_key"}


class ConfigError(ValueError):
    """A serve config that cannot be used; the message says where and what to do."""


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> ServeConfig:
    """YAML file (optional) + environment + dotted overrides -> validated ``ServeConfig``."""
    source = f"config {path}" if path else "serve config"
    data: dict[str, Any] = {}
    if path is not None:
        data = read_yaml(path)
    env = os.environ if env is None else env
    for var, dotted in ENV_OVERRIDES.items():
        if env.get(var):
            set_dotted(data, dotted, env[var])
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return from_dict(data, source=source)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see deploy/serve.example.yaml for one")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections (model:, cache:, ...), "
                          f"found {type(data).__name__}")
    return data


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``set_dotted(d, "router.port", 9000)`` creates intermediate mappings as needed."""
    *parents, last = dotted.split(".")
    node = data
    for i, key in enumerate(parents):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted}: {'.'.join(parents[:i + 1])} is a value, not a section")
        node = child
    node[last] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"router.port=9000"`` -> ("router.port", 9000); the value is parsed as YAML."""
    dotted, sep, raw = text.partition("=")
    if not sep or not dotted.strip():
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. --set cache.block_size=32")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return dotted.strip(), value


def from_dict(data: Mapping[str, Any], source: str = "config") -> ServeConfig:
    """Nested mapping -> ``ServeConfig``; every problem becomes a ``ConfigError`` naming its path."""
    return _build(ServeConfig, data, prefix="", source=source)


def _build(cls: type, data: Any, prefix: str, source: str) -> Any:
    where = prefix.rstrip(".") or "top level"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {where} must be a mapping, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{source}: unknown key {prefix}{key}{did_you_mean(str(key), names)}; "
                              f"valid keys in {where}: {', '.join(names)}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, f"{prefix}{key}.", source)
        else:
            kwargs[key] = _coerce(value, tp, f"{prefix}{key}", source)
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def _coerce(value: Any, tp: Any, dotted: str, source: str) -> Any:
    ok, value = _matches(value, tp)
    if not ok:
        raise ConfigError(f"{source}: {dotted} must be {_type_name(tp)}, got {_describe(value)}")
    return value


def _matches(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            ok, coerced = _matches(value, arm)
            if ok:
                return True, coerced
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            return False, value
        out = {}
        for k, v in value.items():
            ok_k, k = _matches(k, key_tp)
            ok_v, v = _matches(v, val_tp)
            if not (ok_k and ok_v):
                return False, value
            out[k] = v
        return True, out
    raise TypeError(f"config type {tp!r} is not supported by the loader")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arm) for arm in typing.get_args(tp))
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        return f"a mapping of {_type_name(key_tp)} to {_type_name(val_tp)}"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(tp, str(tp))


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"
