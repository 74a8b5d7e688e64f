"""YAML keys, environment variables and CLI flags, all derived from the config dataclasses.

One place defines a field: its dataclass (``replica/config.py``, ``router/config.py``, the
publisher's, ``cluster/config/trees.py``) gives the name, type, default, check (``__post_init__``)
and the one-line doc under it. From that, for a root config whose fields are sections:

    engine.block_size   YAML key     engine: {block_size: 32}
                        environment  KVMESH_ENGINE_BLOCK_SIZE=32
                        CLI flag     --block-size 32   (--engine-block-size if the name is not unique)

A section's field that is itself a dataclass (``router.events``, the subscriber's ``SubscriberConfig``) is a
nested section handed whole to its component: its fields are options too, one level down in YAML
(``router: {events: {max_payload_bytes: N}}``), with flat names for variables and flags
(``KVMESH_ROUTER_EVENTS_MAX_PAYLOAD_BYTES``, ``--events-max-payload-bytes``); the flat YAML key
(``router.events_max_payload_bytes``) is still read, with a deprecation warning. Hiding it hides it all. The flat
names are prefixed with the nested section's name, or with its field's ``metadata={"prefix": P}`` ("": none), so a
section cut out of a flat one keeps its names: ``router.transfers.pd_min_uncached_tokens`` is
``--pd-min-uncached-tokens``, ``router.outliers.consecutive_failures`` ``--outlier-consecutive-failures``.

Secrets are the fields declared with ``repr=False``: they are redacted when printed and get
no CLI flag unless their metadata says ``cli=True`` (argv is visible to every user in ``ps``).
``metadata={"env": NAME}`` adds an environment alias (``KVMESH_HASH_SEED``); ``metadata={"flag": "--x"}`` names
the flag (``--kv-transfer`` for ``kv_transfer.enabled``).
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
    sub: str = ""
    """The nested section it is in (``events`` for ``router.events.max_payload_bytes``); "" for a section's own
    field."""
    prefix: str = ""
    """What its flat name starts with (``sub``, or the nested section's ``metadata["prefix"]``; "": none)."""

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def path(self) -> tuple[str, ...]:
        """Keys from the root to the value: (section, name) or (section, sub, name)."""
        return (self.section, self.sub, self.name) if self.sub else (self.section, self.name)

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def flat_name(self) -> str:
        """The name in its section's flat namespace (variables, flags): ``events_max_payload_bytes``."""
        return flat_name(self.prefix, self.name)

    def value_in(self, tree: Mapping) -> YamlValue:
        """Its value in a nested dict of the root (None where absent)."""
        for key in self.path:
            if not isinstance(tree, Mapping) or key not in tree:
                return None
            tree = tree[key]
        return tree

    @property
    def secret(self) -> bool:
        return not self.field.repr

    @property
    def on_cli(self) -> bool:
        return not self.secret or bool(self.field.metadata.get("cli"))

    @property
    def envs(self) -> tuple[str, ...]:
        derived = f"KVMESH_{self.section}_{self.flat_name}".upper()
        alias = self.field.metadata.get("env")
        return (derived, alias) if alias else (derived,)

    @property
    def is_bool(self) -> bool:
        return self.type is bool

    @property
    def is_mapping(self) -> bool:
        """A dict of values (also ``dict[...] | None``): a repeatable NAME=VALUE flag, a comma-separated variable."""
        return typing.get_origin(self.type) is dict or any(typing.get_origin(a) is dict
                                                             for a in typing.get_args(self.type))

    @property
    def is_sequence(self) -> bool:
        """A list or tuple of values: a repeatable flag, a comma-separated variable."""
        return typing.get_origin(self.type) in (list, tuple)


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
            found += self._fields(section, cls, "", "")
        counts: dict[str, int] = {}
        for _, f, _, _, _, prefix in found:
            flat = flat_name(prefix, f.name)
            counts[flat] = counts.get(flat, 0) + 1
        options = []
        for section, f, tp, doc, sub, prefix in found:
            flat = flat_name(prefix, f.name)
            derived = "--" + (flat if counts[flat] == 1 else f"{section}_{flat}").replace("_", "-")
            flag = f.metadata.get("flag") or derived
            options.append(Option(section, f, tp, doc, flag, sub, prefix))
        return options

    def _fields(self, section: str, cls: type, sub: str,
                prefix: str) -> list[tuple[str, dataclasses.Field, Annotation, str, str, str]]:
        """(section, field, type, doc, sub, prefix) of every visible field of ``cls``, nested sections expanded."""
        hints, docs, out = typing.get_type_hints(cls), field_docs(cls), []
        path = f"{section}.{sub}." if sub else f"{section}."
        for f in dataclasses.fields(cls):
            if path + f.name in self.hidden:
                continue
            if not sub and dataclasses.is_dataclass(hints[f.name]):
                out += self._fields(section, hints[f.name], f.name, nested_prefix(f))
            else:
                out.append((section, f, hints[f.name], docs.get(f.name, ""), sub, prefix))
        return out

    def nested(self, section: str) -> set[str]:
        """The nested sections of ``section`` that have visible options (``{"events"}`` for the router)."""
        return {o.sub for o in self.options if o.section == section and o.sub}

    def renamed(self, dotted: str) -> str | None:
        """The nested key a flat one became (``router.events_max_payload_bytes`` -> ``router.events.max_payload_bytes``,
        ``router.pd_min_uncached_tokens`` -> ``router.transfers.pd_min_uncached_tokens``), hidden ones included; None
        if ``dotted`` never was one."""
        section, _, flat = dotted.partition(".")
        cls = self.sections.get(section)
        if cls is None or not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                for g in dataclasses.fields(hints[f.name]):
                    if flat_name(nested_prefix(f), g.name) == flat:
                        return f"{section}.{f.name}.{g.name}"
        return None

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


def nested_prefix(section: dataclasses.Field) -> str:
    """The flat-name prefix of a nested section's options: its field's ``metadata["prefix"]``, else its name."""
    return section.metadata.get("prefix", section.name)


def flat_name(prefix: str, name: str) -> str:
    """A nested option's name in its section's flat namespace (variables, flags, the YAML key of before)."""
    return f"{prefix}_{name}" if prefix else name


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
    """A field whose text is taken as written: ``str``, or ``bytes`` (hex, which the loader decodes)."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return str in args or bytes in args


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
            _redact(getattr(config, section.name), out[section.name])
    return out


def _redact(value: Dataclass | YamlValue, out: dict) -> None:
    """Secrets of a section (and of its nested sections) -> "<redacted>" in its dict ``out``."""
    for f in dataclasses.fields(value) if dataclasses.is_dataclass(value) else ():
        inner = getattr(value, f.name)
        if dataclasses.is_dataclass(inner):
            _redact(inner, out[f.name])
        elif not f.repr and inner is not None:
            out[f.name] = REDACTED
