"""The xgrammar side of structured outputs (vLLM v1's ``backend_xgrammar.py``): check a constraint, compile it
against this model's tokenizer, and the per-request matcher that fills a token bitmask and advances on each
accepted token.

A bitmask row is ``ceil(vocab_size / 32)`` int32 words; bit ``t % 32`` of word ``t // 32`` set = token ``t``
may come next (xgrammar's layout, which sample/grammar_mask.py unpacks on the device).
xgrammar is imported lazily: it is in the ``engine`` extra, and only a constrained request needs it.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
from kvmesh.replica.engine.grammar_text import any_whitespace, choice_grammar, json_strings_repaired
from kvmesh.replica.serving.sampling_params import SamplingParamsError

if TYPE_CHECKING:
    from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[01:42:53] /project/cpp/x.cc:83: " before xgrammar's message
CHECKED_SIZE = 1024
"""Constraints remembered as checked (a request checked by the HTTP layer is not parsed again by the engine)."""
_checked: OrderedDict[bytes, None] = OrderedDict()  # digests of (key, whitespace default): 1,024 x 32 bytes
_checked_lock = threading.Lock()


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise SamplingParamsError("structured_outputs", "structured outputs need xgrammar on the replica; "
                                  "install kvmesh[engine] (or pip install xgrammar)") from None
    return xgrammar


def error_message(error: Exception | str) -> str:
    """xgrammar's message of ``error`` (or its text), without the C++ source location it starts with."""
    return _LOCATION.sub("", str(error).strip()).strip()


def json_schema_grammar(xgr, schema: str, any_whitespace: bool):
    """xgrammar's grammar of ``schema`` whose every string is valid JSON: length-limited strings get the plain
    strings' character class (engine/grammar_text.py; a no-op where xgrammar already writes it)."""
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=any_whitespace)
    repaired = json_strings_repaired(str(grammar))
    return grammar if repaired is None else xgr.Grammar.from_ebnf(repaired)


def check(params: StructuredOutputsParams, whitespace_default: bool) -> None:
    """Raise ``SamplingParamsError`` naming the request's field when xgrammar cannot express the constraint
    (a schema it does not take, a regex or grammar that does not parse); needs no tokenizer."""
    memo = hashlib.sha256(repr((params.key, whitespace_default)).encode()).digest()
    with _checked_lock:
        if memo in _checked:
            return
    xgr = _xgrammar()
    kind = params.kind
    try:
        if kind == "json":
            xgr.Grammar.from_json_schema(params.json, any_whitespace=any_whitespace(params, whitespace_default))
        elif kind == "regex":
            xgr.Grammar.from_regex(params.regex)
        elif kind == "grammar":
            xgr.Grammar.from_ebnf(params.grammar)
        elif kind == "choice":
            xgr.Grammar.from_ebnf(choice_grammar(params.choice))
    except Exception as e:  # xgrammar raises RuntimeError / InvalidJSONError with the parser's message
        what = {"json": "JSON schema", "regex": "regex", "grammar": "grammar", "choice": "choice"}[kind]
        raise SamplingParamsError(params.field,
                                  f"{params.field}: the {what} cannot be compiled: {error_message(e)}") from None
    with _checked_lock:
        _checked[memo] = None
        while len(_checked) > CHECKED_SIZE:
            _checked.popitem(last=False)


def tokenizer_info(tokenizer: HFTokenizer, vocab_size: int, stop_token_ids: list[int]):
    """xgrammar's ``TokenizerInfo`` of this model's tokenizer (what compiled grammars are built against)."""
    return _xgrammar().TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                      stop_token_ids=stop_token_ids or None)


def compiled_from_json(text: str, info):
    """A ``CompiledGrammar`` a compile process sent (``serialize_json``), for ``info``'s tokenizer."""
    return _xgrammar().CompiledGrammar.deserialize_json(text, info)


class GrammarMatcher:
    """One request's place in its grammar: which tokens may come next, advanced by each accepted token."""

    __slots__ = ("_matcher",)

    def __init__(self, compiled) -> None:
        self._matcher = _xgrammar().GrammarMatcher(compiled)

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False when the grammar does not allow it (the matcher stays where it was)."""
        return self._matcher.accept_token(token_id)

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into row ``row`` of ``bitmask`` (a [R, W] int32 torch tensor)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and ended by a stop token: nothing may follow."""
        return self._matcher.is_terminated()

    def reset(self) -> None:
        self._matcher.reset()


class BitmaskFiller:
    """Fills the bitmask rows of many matchers in one call into xgrammar (``threads`` C++ threads, the GIL released),
    instead of one Python call per row."""

    def __init__(self, threads: int) -> None:
        self._batch = _xgrammar().BatchGrammarMatcher(threads)

    def fill(self, matchers: list[GrammarMatcher], bitmask) -> None:
        """Row i of ``bitmask`` [len(matchers), W] = what ``matchers[i]`` allows next."""
        self._batch.batch_fill_next_token_bitmask([m._matcher for m in matchers], bitmask)


def allocate_bitmask(num_rows: int, vocab_size: int):
    """A [num_rows, ceil(vocab_size / 32)] int32 host tensor (xgrammar fills it in place; all ones: no limit)."""
    return _xgrammar().allocate_token_bitmask(num_rows, vocab_size)


def as_numpy(bitmask) -> np.ndarray:
    return bitmask.numpy()
