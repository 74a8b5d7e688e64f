"""CLI flags derived from a command's config schema (``schema.py``), and their parsing.

Every visible field gets one flag named after it (``engine.block_size`` -> ``--block-size``) with
its doc line and default as help; booleans get ``--x/--no-x``; mappings take ``NAME=VALUE``
(repeatable) or one JSON object, as vLLM spells ``--speculative-config '{...}'``. Flags left out change
nothing, so YAML < environment < flags holds field by field.
Secrets without a flag (the hash seed) are refused with a message that says where they go.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from kvmesh.cluster.config import vllm_forms
from kvmesh.cluster.config.loader import ConfigError, load
from kvmesh.cluster.config.schema import (
    Option,
    Root,
    Schema,
    YamlValue,
    assignments,
    field_docs,
    value_from_text,
)


class _OptionalBool(argparse.Action):
    """A ``bool | None`` field: ``--x`` is true, ``--no-x`` false, ``--x VALUE`` any of true, false or auto."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", metavar="{true,false,auto}", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"{option_string} takes no value")
            values = "false"
        setattr(namespace, self.dest, "true" if values is None else "null" if values == "auto" else values)


class _RefuseSecret(argparse.Action):
    """A secret given on the command line: refuse it (argv is visible to every user in `ps`)."""

    def __init__(self, option_strings, dest, option: Option, **kwargs):
        self.option = option
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: {self.option.dotted} is a secret and is not accepted on the command line "
                     f"(every user of this machine sees argv in `ps`); set {' or '.join(self.option.envs)}, "
                     "or put it in the --config file")


def add_config_arguments(parser: argparse.ArgumentParser, schema: Schema[Root], config_file: bool = True) -> None:
    """One flag per visible field of ``schema``, grouped by section."""
    if config_file:
        parser.add_argument("--config", "-c", metavar="FILE",
                            help="YAML config file with the sections below (see deploy/serve.example.yaml)")
    defaults = schema.section_defaults()
    root_docs = field_docs(schema.root)
    for section in schema.sections:
        group = parser.add_argument_group(f"{section} ({section}: in YAML, KVMESH_{section.upper()}_* variables)",
                                          root_docs.get(section))
        for opt in (o for o in schema.options if o.section == section):
            if not opt.on_cli:
                group.add_argument(opt.flag, dest=_dest(opt), option=opt, action=_RefuseSecret)
                continue
            default = opt.value_in(defaults)
            help_text = opt.doc.replace("%", "%%")
            if not opt.secret and default not in (None, {}, ""):
                help_text += f" [default: {default}]"
            if opt.secret:
                help_text += f" Prefer {opt.envs[-1]}: argv is visible in `ps`."
            common = {"dest": _dest(opt), "default": argparse.SUPPRESS}
            if opt.is_bool:
                group.add_argument(opt.flag, **common, help=help_text, action=argparse.BooleanOptionalAction)
            elif _is_optional_bool(opt):  # vLLM's switch (--async-scheduling), its --no- form, or a value
                group.add_argument(opt.flag, "--no-" + opt.flag[2:], **common, help=help_text, action=_OptionalBool)
            elif opt.is_mapping:  # several after one flag (vLLM's --lora-modules a=p b=q), and repeatable
                group.add_argument(opt.flag, **common, help=help_text + " (several, repeatable)", action="extend",
                                   nargs="+", metavar="NAME=VALUE")
            elif opt.is_sequence:
                group.add_argument(opt.flag, **common, help=help_text + " (repeatable)", action="append",
                                   metavar="VALUE")
            elif opt.name == vllm_forms.SERVED_NAME_FIELD:  # vLLM's several names after one flag
                group.add_argument(opt.flag, **common, nargs="+", metavar="NAME",
                                   help=help_text + " Several names: each is accepted as the model, the first is "
                                   "the one /v1/models reports.")
            else:
                group.add_argument(opt.flag, **common, help=help_text, metavar=_metavar(opt))


def overrides_from_args(args: argparse.Namespace, schema: Schema[Root]) -> dict[str, YamlValue]:
    """The dotted-path values the user gave on the command line."""
    overrides: dict[str, YamlValue] = {}
    for opt in schema.options:
        if not hasattr(args, _dest(opt)):
            continue
        raw = getattr(args, _dest(opt))
        if opt.is_bool:
            overrides[opt.dotted] = raw
        elif opt.is_mapping and opt.dotted != "engine.lora_modules" and len(raw) == 1 \
                and raw[0].lstrip().startswith("{"):  # vLLM's JSON form (--lora-modules has its own, vllm_forms)
            overrides[opt.dotted] = _json_object(raw[0], opt.flag)
        elif opt.is_mapping:
            items = vllm_forms.lora_items(raw) if opt.dotted == "engine.lora_modules" else raw
            try:
                overrides[opt.dotted] = assignments(items, opt.flag)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        elif opt.name == vllm_forms.SERVED_NAME_FIELD:
            overrides[opt.dotted] = raw[0] if len(raw) == 1 else list(raw)
        elif opt.is_sequence:  # a list of sections (deployments.models) takes one YAML mapping per flag
            overrides[opt.dotted] = [value_from_text(v, None) for v in raw] if _of_sections(opt) else list(raw)
        else:
            overrides[opt.dotted] = value_from_text(raw, opt.type)
    if hasattr(args, vllm_forms.MODEL_DEST):
        model = vllm_forms.model_from_args(args, overrides.get("engine.model"))
        if model is not None:
            overrides["engine.model"] = model
    return overrides


def config_from_args(args: argparse.Namespace, schema: Schema[Root], env: Mapping[str, str] | None = None) -> Root:
    """YAML (``--config``) + environment + flags -> the root config; raises ``ConfigError``."""
    return load(schema, getattr(args, "config", None), overrides_from_args(args, schema), env)


def _json_object(text: str, flag: str) -> dict:
    """``--speculative-config '{"method": "ngram", ...}'``: one JSON object (vLLM's spelling of such flags)."""
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{flag}: {text!r} is not a JSON object ({e})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object {{...}} or NAME=VALUE pairs, got {text!r}")
    return value


def _metavar(opt: Option) -> str:
    import typing

    arms = set(typing.get_args(opt.type)) or {opt.type}
    return "N" if int in arms and str not in arms else "X" if float in arms else "VALUE"


def _is_optional_bool(opt: Option) -> bool:
    import typing

    return set(typing.get_args(opt.type)) == {bool, type(None)}


def _of_sections(opt: Option) -> bool:
    """A list whose items are dataclasses (``deployments.models``)."""
    import dataclasses
    import typing

    return any(dataclasses.is_dataclass(arg) for arg in typing.get_args(opt.type))


def _dest(opt: Option) -> str:
    return "cfg__" + opt.dotted.replace(".", "__")


__all__ = ["ConfigError", "add_config_arguments", "config_from_args", "overrides_from_args"]
