"""Hostile JSON values for a request field, derived from the field's type (the noisy-neighbour suite's fallback).

A ``Hostile`` is a label and the JSON text of one value, written when a case is sent (the huge ones are megabytes),
as raw text so that what ``json.dumps`` cannot write goes too: ``NaN``, ``Infinity``, a 100,000-digit integer, a
lone UTF-16 surrogate. ``by_type(annotation)`` gives, for any annotation a request model uses, the values every
field gets: null, nesting 10,000 deep, wrong types, and per kind the huge and the pathological (below). An
annotation it cannot read raises ``TypeError``: a new kind of field must be taught here before it is covered.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, JsonValue

DEPTH = 10_000
"""Nesting of the deep values (far past any recursion limit of a JSON parser written in Python)."""
HUGE_CHARS = 1_100_000
"""Characters of a huge string: past the replicas' ``max_prompt_chars`` (1 Mi), far below ``max_body_bytes``."""
HUGE_ITEMS = 100_000
"""Items of a huge list or object."""
DIGITS = 100_000
"""Digits of a huge integer (Python refuses to convert more than 4,300 digits by default)."""


@dataclass(frozen=True)
class Hostile:
    """One hostile value of a field: ``text()`` is its JSON text; ``also`` other fields sent with it (a combination
    that is hostile only together)."""

    label: str
    text: Callable[[], str]
    also: tuple[tuple[str, object], ...] = ()


def raw(label: str, text: str) -> Hostile:
    return Hostile(label, lambda: text)


def value(label: str, obj: object, **also: object) -> Hostile:
    """A value ``json.dumps`` writes (built when sent)."""
    return Hostile(label, lambda: json.dumps(obj), tuple(also.items()))


def lazy(label: str, make: Callable[[], object]) -> Hostile:
    """A value built when first sent, its text kept (the huge ones go to many fields)."""
    return Hostile(label, functools.cache(lambda: json.dumps(make())))


ALWAYS = (
    raw("null", "null"),
    raw("a list 10,000 deep", "[" * DEPTH + "]" * DEPTH),
    raw("an object 10,000 deep", '{"a":' * DEPTH + "0" + "}" * DEPTH),
)
"""What every field gets."""
WRONG = {"bool": raw("true", "true"), "int": raw("-1", "-1"), "float": raw("2.5", "2.5"), "str": raw('"x"', '"x"'),
         "list": raw("[]", "[]"), "object": raw("{}", "{}")}
"""One value of each JSON kind: a field gets those of the kinds it does not take (wrong types)."""
NUMBERS = (raw("NaN", "NaN"), raw("Infinity", "Infinity"), raw("-Infinity", "-Infinity"), raw("1e999", "1e999"),
           raw("-1e308", "-1e308"), raw(f"{DIGITS:,} digits", "9" * DIGITS))
"""Pathological numbers, for any numeric field."""
BY_KIND: dict[str, tuple[Hostile, ...]] = {
    "bool": (raw("0", "0"), raw('"true"', '"true"')),
    "int": (raw("-2**63-1", str(-2**63 - 1)), raw("2**64", str(2**64)), raw("10**30", str(10**30)),
            raw("1.5", "1.5"), raw('"1"', '"1"'), *NUMBERS),
    "float": (raw("1e-320", "1e-320"), raw("1e-30", "1e-30"), raw("1e308", "1e308"), raw("-0.0", "-0.0"),
              raw('"nan"', '"nan"'), *NUMBERS),
    "str": (lazy("a huge string", lambda: "a" * HUGE_CHARS), value("combining marks", "e\u0301" * 10_000),
            raw('""', '""'),
            raw("a lone surrogate", '"\\ud800 \\udfff"'), value("NUL and controls", "\x00\x1b[2J\r\n"),
            value("bidi and BOM", "\ufeff\u202etxt.exe\u202c\U0001F600"),
            value("a template", "{{ 7*7 }}{% for x in range(10**9) %}x{% endfor %}%s%n{0}")),
    "list": (lazy("a huge list", lambda: [0] * HUGE_ITEMS), raw("[null]", "[null]")),
    "object": (lazy("a huge object", lambda: {f"k{i}": i for i in range(HUGE_ITEMS)}),
               raw("a lone-surrogate key", '{"\\ud800": 1}')),
    "literal": (raw('"LEFT"', '"LEFT"'), lazy("a huge string", lambda: "a" * HUGE_CHARS)),
    "any": (raw("NaN", "NaN"), raw(f"{DIGITS:,} digits", "9" * DIGITS), lazy("a huge string", lambda: "a" * HUGE_CHARS),
            lazy("a huge object", lambda: {f"k{i}": i for i in range(HUGE_ITEMS)}),
            raw("a lone surrogate", '"\\ud800"'),
            raw("true", "true"), raw('"x"', '"x"'), raw("-1", "-1")),
}
"""The huge and pathological values of each kind a field takes (``any``: a field that takes any JSON value)."""
_JSON_KINDS = set(WRONG)


def kinds(annotation: object) -> set[str]:
    """The JSON kinds an annotation takes: bool, int, float, str, list, object, literal, model, any."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is JsonValue or annotation is typing.Any:
        return {"any"}
    if origin is typing.Annotated:
        return kinds(args[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(kinds(a) for a in args))
    if annotation is type(None):
        return set()
    if origin is typing.Literal:
        return {"literal"}
    if origin is list:
        return {"list"}
    if origin is dict:
        return {"object"}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {"model"}
    for kind, python in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if annotation is python:
            return {kind}
    raise TypeError(f"no hostile values for the type {annotation!r}: teach tests/security/hostile_values.py its kind")


def by_type(annotation: object) -> list[Hostile]:
    """The values a field of this type gets (the module doc)."""
    taken = kinds(annotation)
    accepts = set(_JSON_KINDS if "any" in taken else taken)
    accepts |= {"object"} if "model" in taken else set()
    accepts |= {"str"} if "literal" in taken else set()
    out = list(ALWAYS)
    out += [hostile for kind, hostile in WRONG.items() if kind not in accepts]
    for kind in sorted(taken):
        out += BY_KIND.get(kind, ())
    return out
