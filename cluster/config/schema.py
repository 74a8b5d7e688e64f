"""YAML keys, environment variables and CLI flags, all derived from the config dataclasses.

One place defines a field: its dataclass (``replica/config.py``, ``router/config.py``, the
publisher's, ``cluster/config/trees.py``) gives the name, type, default, check (``__post_init__``)
and the one-line doc under it. From that, for a root config whose fields are sections:

    engine.block_size   YAML key     engine: {block_size: 32}
                        environment  KVMESH_ENGINE_BLOCK_SIZE=32
                        CLI flag     --block-size 32   (--engine-block-size if the name is not unique)

Secrets are the fields declared with ``repr=False``: they are redacted when printed and get
no CLI flag unless their metadata says ``cli=True`` (argv is visible to every user in ``ps``).
``metadata={"env": NAME}`` adds an environment alias (``KVMESH_HASH_SEED``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

import yaml

REDACTED = "<redacted>"
_NULLS = ("none", "null", "~")

YamlValue = str | int | float | bool | list | dict | None
"""A value as a YAML file, a variable or a flag gives it, before msgspec converts it to the field's type."""
Tree = dict[str, dict[str, YamlValue]]
"""A root config as plain data: section -> key -> value (YAML-ready)."""
Annotation = type | types.UnionType | types.GenericAlias
"""A field's resolved type annotation: ``int``, ``str | None``, ``dict[str, float]``."""


class Dataclass(Protocol):
    """Any dataclass instance (a config section or a root config)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field]]


Root = TypeVar("Root", bound=Dataclass)
"""The root config class of a schema (``ServeConfig``, ``ReplicaCommandConfig``, ...)."""


@dataclass(frozen=True)
class Option:
    """One configurable field of one section."""

    section: str
    """Section name in the root config (``engine``, ``router``, ...)."""
    field: dataclasses.Field
    """The dataclass field (name, type, default, metadata)."""
    type: Annotation
    """The field's resolved type annotation."""
    doc: str
    """First line of the field's doc."""
    flag: str
    """CLI flag, e.g. ``--block-size``."""

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def secret(self) -> bool:
        return not self.field.repr

    @property
    def on_cli(self) -> bool:
        return not self.secret or bool(self.field.metadata.get("cli"))

    @property
    def envs(self) -> tuple[str, ...]:
        derived = f"KVMESH_{self.section}_{self.name}".upper()
        alias = self.field.metadata.get("env")
        return (derived, alias) if alias else (derived,)

    @property
    def is_bool(self) -> bool:
        return self.type is bool

    @property
    def is_mapping(self) -> bool:
        return typing.get_origin(self.type) is dict


@dataclass(frozen=True)
class Schema(Generic[Root]):
    """The options of one command: a root dataclass whose fields are sections."""

    root: type[Root]
    """The root config class (``ServeConfig``, ...)."""
    hidden: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Dotted field -> why users do not set it in this command (derived from another field)."""

    @functools.cached_property
    def sections(self) -> dict[str, type]:
        hints = typing.get_type_hints(self.root)
        return {f.name: hints[f.name] for f in dataclasses.fields(self.root)}

    @functools.cached_property
    def options(self) -> list[Option]:
        found = []
        for section, cls in self.sections.items():
            hints, docs = typing.get_type_hints(cls), field_docs(cls)
            for f in dataclasses.fields(cls):
                if f"{section}.{f.name}" not in self.hidden:
                    found.append((section, f, hints[f.name], docs.get(f.name, "")))
        counts: dict[str, int] = {}
        for _, f, _, _ in found:
            counts[f.name] = counts.get(f.name, 0) + 1
        return [Option(section, f, tp, doc, "--" + (f.name if counts[f.name] == 1 else f"{section}_{f.name}")
                       .replace("_", "-")) for section, f, tp, doc in found]

    def option(self, dotted: str) -> Option | None:
        return next((o for o in self.options if o.dotted == dotted), None)

    def section_defaults(self) -> Tree:
        """Each section's defaults in this root (``ServeConfig`` defaults its engine's model, ...)."""
        out: Tree = {}
        for f in dataclasses.fields(self.root):
            if f.default_factory is not dataclasses.MISSING:
                out[f.name] = dataclasses.asdict(f.default_factory())
            else:
                out[f.name] = {}
        return out


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: first line of the string literal under it}`` from the class source (PEP 257 style)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def allows_none(tp: Annotation) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def allows_str(tp: Annotation) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return str in typing.get_args(tp)
    return tp is str


def value_from_text(text: str, tp: Annotation | None) -> YamlValue:
    """A CLI / environment string -> the value for a field of type ``tp`` (None: any; msgspec converts the rest)."""
    if (tp is None or tp is typing.Any or allows_none(tp)) and text.strip().lower() in _NULLS:
        return None
    if allows_str(tp):
        return text
    try:
        return yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        return text


def assignments(items: list[str], what: str) -> dict[str, YamlValue]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r}: expected NAME=VALUE")
        out[key.strip()] = value_from_text(raw, None)
    return out


def to_dict(config: Dataclass, redact: bool = True) -> Tree:
    """Nested plain dict of a root config (YAML-ready); secrets -> "<redacted>" unless redact=False."""
    out = dataclasses.asdict(config)
    if redact:
        for section in dataclasses.fields(config):
            value = getattr(config, section.name)
            for f in dataclasses.fields(value) if dataclasses.is_dataclass(value) else ():
                if not f.repr and getattr(value, f.name) is not None:
                    out[section.name][f.name] = REDACTED
    return out


def commented_yaml(schema: Schema[Root], config: Root, header: str = "") -> str:
    """The config as YAML with each field's doc line above it (secrets redacted, hidden fields left out)."""
    values = to_dict(config)
    lines = [header.rstrip()] if header else []
    root_docs = field_docs(schema.root)
    for section in schema.sections:
        lines += ["", f"# {root_docs.get(section, '')}", f"{section}:"]
        for opt in (o for o in schema.options if o.section == section):
            value = values[section][opt.name]
            env = " or ".join(opt.envs)
            lines.append(f"  # {opt.doc}" + (f" Secret: prefer {env}." if opt.secret else ""))
            dumped = yaml.safe_dump({opt.name: value}, default_flow_style=True, sort_keys=False, width=1000)
            lines.append("  " + dumped.strip()[1:-1].strip())
    return "\n".join(lines).lstrip("\n") + "\n"


def markdown_table(schema: Schema) -> str:
    """A Markdown reference of every option: YAML key, flag, environment variable, default, doc."""
    defaults = schema.section_defaults()
    rows = ["| key | flag | default | meaning |", "|---|---|---|---|"]
    for opt in schema.options:
        default = "" if opt.secret else yaml.safe_dump(defaults[opt.section][opt.name], default_flow_style=True,
                                                       width=1000).strip().removesuffix("...").strip()
        flag = f"`{opt.flag}`" if opt.on_cli else "(env/file only)"
        doc = opt.doc.replace("|", "\\|")
        rows.append(f"| `{opt.dotted}` | {flag} | `{default}` | {doc} |")
    return "\n".join(rows) + "\n"
