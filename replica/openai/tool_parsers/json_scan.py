"""Where the parts of a JSON value lie in text that may still be growing (a model's output, token by token).

Tool-call parsers read a call's ``name`` and ``arguments`` out of the generated text before it is complete, so
that a stream can send the name as soon as it is whole and the arguments as they come. These scanners never
decode: they return character offsets into the text, ``None`` as the end of a part the text has not finished
yet, and raise ``ValueError`` where the text cannot be JSON at all.

    text   {"name": "get_weather", "arguments": {"city": "Par
                    ^name: (9, 22)              ^arguments: (37, None)   (still open)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

WHITESPACE = " \t\n\r"
_CLOSERS = {"{": "}", "[": "]"}
_SCALAR_END = ",}]" + WHITESPACE


def skip_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


_STRUCTURE = re.compile(r'[{}\[\]"]')
"""The characters that open or close something inside a container (the rest is skipped in C)."""


def _string_end(text: str, i: int) -> int | None:
    """End (exclusive) of the JSON string opening at ``text[i] == '"'``; None if the text ends inside it (``find``
    walks in C: the parsers ask again as the text grows)."""
    at = i + 1
    while (quote := text.find('"', at)) >= 0:
        backslashes = quote - 1
        while backslashes > i and text[backslashes] == "\\":
            backslashes -= 1
        if (quote - 1 - backslashes) % 2 == 0:  # not escaped
            return quote + 1
        at = quote + 1
    return None


def value_end(text: str, i: int) -> int | None:
    """End (exclusive) of the JSON value starting at ``text[i]``; None if the text ends before it does."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in _CLOSERS:
        stack = [_CLOSERS[c]]
        i += 1
        while (match := _STRUCTURE.search(text, i)) is not None:
            i, c = match.start(), match.group()
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in _CLOSERS:
                stack.append(_CLOSERS[c])
            elif c in "}]":
                if c != stack.pop():
                    raise ValueError(f"unbalanced {c!r} at offset {i}")
                if not stack:
                    return i + 1
            i += 1
        return None
    if c in _SCALAR_END or c == ":":
        raise ValueError(f"no JSON value at offset {i}")
    while i < len(text) and text[i] not in _SCALAR_END:
        i += 1
    return i if i < len(text) else None  # a number may still grow


@dataclass(slots=True)
class ObjectScan:
    """One JSON object's members as offsets: key -> (value start, value end or None while open)."""

    members: dict[str, tuple[int, int | None]]
    end: int | None
    """End (exclusive) of the object; None while it is open."""

    def value(self, text: str, key: str) -> str | None:
        """The member's value text so far (``""`` before it starts), or None when the object has no such key."""
        if key not in self.members:
            return None
        start, end = self.members[key]
        return text[start:end] if end is not None else text[start:]

    def complete(self, key: str) -> bool:
        return key in self.members and self.members[key][1] is not None


def scan_object(text: str, i: int) -> ObjectScan:
    """The members of the object opening at ``text[i] == '{'`` as far as the text goes."""
    if i >= len(text) or text[i] != "{":
        raise ValueError(f"no JSON object at offset {i}")
    scan = ObjectScan({}, None)
    i = skip_whitespace(text, i + 1)
    if i < len(text) and text[i] == "}":
        scan.end = i + 1
        return scan
    while i < len(text):
        if text[i] != '"':
            raise ValueError(f"expected a key at offset {i}")
        key_end = _string_end(text, i)
        if key_end is None:
            return scan
        key = json.loads(text[i:key_end])
        i = skip_whitespace(text, key_end)
        if i >= len(text):
            return scan
        if text[i] != ":":
            raise ValueError(f"expected ':' at offset {i}")
        start = skip_whitespace(text, i + 1)
        end = value_end(text, start)
        scan.members[key] = (start, end)
        if end is None:
            return scan
        i = skip_whitespace(text, end)
        if i >= len(text):
            return scan
        if text[i] == "}":
            scan.end = i + 1
            return scan
        if text[i] != ",":
            raise ValueError(f"expected ',' or '}}' at offset {i}")
        i = skip_whitespace(text, i + 1)
    return scan
