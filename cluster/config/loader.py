"""Build a command's config from YAML, the environment and CLI flags, with errors for people.

Precedence, lowest first: dataclass defaults < YAML file < environment (``KVMESH_<SECTION>_<FIELD>``,
plus the secrets' short names ``KVMESH_HASH_SEED`` / ``KVMESH_API_KEY``) < CLI flags.

Unknown keys are rejected at any depth with a did-you-mean; msgspec converts the values to the
fields' types and runs the sections' ``__post_init__`` checks; every problem becomes one
``ConfigError`` line that names the key, the flag and the variable that set it.
"""

from __future__ import annotations

import logging
import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path

import msgspec
import yaml
from kvmesh.cluster.config.schema import Option, Root, Schema, Tree, YamlValue, assignments, value_from_text
from kvmesh.cluster.config.trees import SERVE_SCHEMA, ServeConfig

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config that cannot be used; the message says where and what to do."""


def load(schema: Schema[Root], path: str | Path | None = None, overrides: Mapping[str, YamlValue] | None = None,
         env: Mapping[str, str] | None = None) -> Root:
    """YAML file (optional) + environment + dotted overrides -> the validated root config."""
    source = f"config {path}" if path else "config"
    data = schema.section_defaults()
    if path is not None:
        _merge(schema, data, read_yaml(path), source)
    env = os.environ if env is None else env
    for opt in schema.options:
        for var in opt.envs:
            if env.get(var):
                _set(data, opt,
                     value_from_text(env[var], opt.type) if not (opt.is_mapping or opt.is_sequence) else env[var], var)
    for dotted, value in (overrides or {}).items():
        opt = _known(schema, dotted, "command line")
        _set(data, opt, value, "command line")
    return convert(schema, data, source)


def load_config(path: str | Path | None = None, overrides: Mapping[str, YamlValue] | None = None,
                env: Mapping[str, str] | None = None) -> ServeConfig:
    """``kvmesh serve``'s ``ServeConfig`` (see ``load``)."""
    return load(SERVE_SCHEMA, path, overrides, env)


def from_dict(data: Mapping[str, YamlValue], schema: Schema[Root] = SERVE_SCHEMA, source: str = "config") -> Root:
    """Nested mapping (as in YAML) -> validated root config."""
    merged = schema.section_defaults()
    _merge(schema, merged, data, source)
    return convert(schema, merged, source)


def read_yaml(path: str | Path) -> dict[str, YamlValue]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see deploy/serve.example.yaml for one")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, found {type(data).__name__}")
    return data


def convert(schema: Schema[Root], data: Tree, source: str) -> Root:
    try:
        return msgspec.convert(data, schema.root, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {_explain(schema, data, str(e))}") from None


def _merge(schema: Schema[Root], data: Tree, given: Mapping[str, YamlValue], source: str) -> None:
    for section, values in given.items():
        if section not in schema.sections:
            hint = did_you_mean(str(section), list(schema.sections))
            raise ConfigError(f"{source}: unknown section {section!r}{hint}; "
                              f"sections: {', '.join(schema.sections)}")
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: {section} must be a mapping of keys, got {values!r}")
        nested = schema.nested(section)
        for key, value in values.items():
            if key in nested and isinstance(value, Mapping):
                for name, inner in value.items():
                    _set(data, _known(schema, f"{section}.{key}.{name}", source), inner, source)
            else:
                _set(data, _known(schema, f"{section}.{key}", source), value, source)


def _known(schema: Schema[Root], dotted: str, source: str) -> Option:
    opt = schema.option(dotted)
    if opt is not None:
        return opt
    for hidden in (dotted, dotted.rpartition(".")[0]):
        if hidden in schema.hidden:
            raise ConfigError(f"{source}: {dotted} cannot be set in this command: {schema.hidden[hidden]}")
    renamed = schema.renamed(dotted)
    if renamed is not None:
        opt = _known(schema, renamed, source)
        logger.warning("%s: %s is deprecated, it is now %s (YAML: %s: {%s: {%s: ...}}); the flag and the "
                       "variable keep their names", source, dotted, renamed, *opt.path)
        return opt
    section, _, key = dotted.partition(".")
    names = [".".join(o.path[1:]) for o in schema.options if o.section == section]
    raise ConfigError(f"{source}: unknown key {dotted}{did_you_mean(key, names)}; "
                      f"valid keys in {section}: {', '.join(names)}")


def _set(data: Tree, opt: Option, value: YamlValue, source: str) -> None:
    section = data.setdefault(opt.section, {})
    if opt.sub:
        section = section.setdefault(opt.sub, {})
    if opt.is_sequence and isinstance(value, str):  # a variable: comma-separated
        value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, str | int) and _takes_bytes(opt.type):
        value = _hex_bytes(str(value), opt, source)
    if opt.is_mapping and isinstance(value, str):
        try:
            value = assignments([v for v in value.split(",") if v.strip()], source)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    section[opt.name] = value


def _takes_bytes(tp: object) -> bool:
    return tp is bytes or bytes in typing.get_args(tp)


def _hex_bytes(text: str, opt: Option, source: str) -> bytes:
    """Bytes written in a file or variable: hex digits (base64 or raw text would be taken silently as other bytes)."""
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"{source}: {opt.dotted} ({opt.envs[0]}) is not hex digits: bytes in a file or variable are "
                          f"written as hex ({opt.doc.removeprefix('SECRET: ')})") from None


def _explain(schema: Schema[Root], data: Tree, message: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.engine.block_size`" -> a line that names the flag."""
    m = re.fullmatch(r"(.*?)(?: - at `\$\.?([^`]*)`)?", message, flags=re.S)
    text, path = m.group(1), (m.group(2) or "")
    parts = [p for p in re.split(r"[.\[\]]", path) if p]
    missing = re.fullmatch(r"Object missing required field `(\w+)`", text)
    if missing:
        parts.append(missing.group(1))
        text = "is required"
    if len(parts) >= 2:
        opt = schema.option(".".join(parts[:3])) or schema.option(".".join(parts[:2]))
        dotted = opt.dotted if opt else ".".join(parts[:2])
        value = opt.value_in(data) if opt else data.get(parts[0], {}).get(parts[1], None)
        where = f" ({opt.flag} or {opt.envs[0]})" if opt and opt.on_cli else (f" ({opt.envs[-1]})" if opt else "")
        shown = "" if missing or (opt and opt.secret) else f" (the value was {value!r})"
        return f"{dotted}{where}: {text[0].lower() + text[1:]}{shown}"
    prefix = f"{parts[0]}: " if parts and not text.startswith(f"{parts[0]}.") else ""
    return prefix + text


def did_you_mean(key: str, candidates: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
