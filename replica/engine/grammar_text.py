"""The text side of a constraint, shared by the engine (engine/xgrammar_backend.py) and its compile processes
(engine/grammar_worker.py, which import nothing else of kvmesh): the EBNF of a choice, the whitespace a JSON
grammar allows, and the repair of xgrammar's length-limited JSON strings. Standard library only."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

STRING_CHARACTER = r'[^\"\\\r\n]'
"""The character class xgrammar (0.2) writes for a JSON string with ``minLength``/``maxLength``: unlike its plain
strings' class it lets control characters through, which JSON forbids unescaped (``json.loads`` refuses the text)."""
JSON_STRING_CHARACTER = r'[^\0-\x1f\"\\\r\n]'
"""The class of its plain strings: no control character, no quote, no backslash."""


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF of "exactly one of these strings" (each a JSON string literal, which EBNF reads the same way)."""
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def any_whitespace(params: StructuredOutputsParams, default: bool) -> bool:
    return default if params.disable_any_whitespace is None else not params.disable_any_whitespace


def json_strings_repaired(ebnf: str) -> str | None:
    """``ebnf`` (xgrammar's grammar of a JSON schema) with its length-limited strings given the plain strings'
    character class, so every string it allows is valid JSON; None when it has none to repair."""
    if STRING_CHARACTER not in ebnf:
        return None
    return ebnf.replace(STRING_CHARACTER, JSON_STRING_CHARACTER)


def compile_job(params: StructuredOutputsParams, whitespace_default: bool) -> tuple[str, str, bool]:
    """What a compile process is sent for ``params``: (kind, text, any whitespace), the kind one of ``json``,
    ``json_object``, ``regex``, ``grammar`` (a choice goes as its grammar), in plain types only."""
    kind = params.kind
    ws = any_whitespace(params, whitespace_default)
    if kind == "json":
        return "json", params.json, ws
    if kind == "json_object":
        return "json_object", "", ws
    if kind == "regex":
        return "regex", params.regex, ws
    return "grammar", choice_grammar(params.choice) if kind == "choice" else params.grammar, ws
