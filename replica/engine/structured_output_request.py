"""One request's grammar in the engine: its compile, then its matcher, and the reasoning before the constraint
applies (structured_output.py's module doc; ``StructuredOutputManager`` makes and drives these)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from kvmesh.replica.engine import xgrammar_backend
from kvmesh.replica.engine.grammar_pool import CompileFuture, CompileTimeout

if TYPE_CHECKING:
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

REASONING_WINDOW = 32
"""Tokens of the output decoded together to find a match of ``reasoning_end_pattern`` (an opener and what must follow
it, with some whitespace between)."""



class StructuredOutputRequest:
    """One request's grammar: compiling (``future``), then its matcher (built by ``StructuredOutputManager.poll``)."""

    __slots__ = ("params", "future", "matcher", "resumed", "since", "reasoning_ids", "waited", "rule")

    def __init__(self, params: StructuredOutputsParams, future: Future, resumed: list[int],
                 waited: bool = True) -> None:
        self.params, self.future, self.matcher = params, future, None
        self.waited = waited  # it waited for a compile (else the cache had its grammar: nothing to charge)
        self.resumed = resumed  # output the constraint matched before (a continuation): fed to the new matcher
        self.since = time.monotonic()  # when it started waiting for its grammar
        self.reasoning_ids: list[int] | None = [] if params.reasoning_end else None
        """The output's last tokens while the reasoning runs (None: the constraint applies)."""
        self.rule: re.Pattern[str] | None = None if params.reasoning_end_pattern is None else \
            re.compile(params.reasoning_end_pattern)
        """What ends the reasoning besides the text ``reasoning_end`` (None: nothing else)."""

    def reason(self, token: int, decode: Callable[[list[int]], str]) -> None:
        """One more token of the reasoning: the constraint applies from the next token once the output has written
        ``reasoning_end``. The last few tokens are decoded together (a token decoded alone may lose its leading
        space), enough of them to hold the end text: every token writes at least one character."""
        end, rule, ids = self.params.reasoning_end, self.rule, self.reasoning_ids
        ids.append(token)
        del ids[:-(len(end) + 1 if rule is None else max(len(end) + 1, REASONING_WINDOW))]
        text = decode(ids)
        if end in text or (rule is not None and rule.search(text) is not None):
            self.reasoning_ids = None

    @property
    def ready(self) -> bool:
        """The grammar compiled and the matcher is built (the scheduler admits the request then)."""
        return self.matcher is not None

    def start(self) -> str | None:
        """Build the matcher of the compiled grammar and feed it the resumed tokens; an error, or None."""
        if self.future.cancelled():
            return f"{self.params.field}: the grammar compile was stopped (the engine is closing)"
        if isinstance(error := self.future.exception(), CompileTimeout):
            return f"{self.params.field}: the grammar {error}"
        if error is not None:
            return f"{self.params.field}: the grammar failed to compile: {xgrammar_backend.error_message(error)}"
        matcher = xgrammar_backend.GrammarMatcher(self.future.result())
        for i, token in enumerate(self.resumed):
            if not matcher.accept(token):
                return (f"{self.params.field}.num_resumed_tokens: resumed token {i} ({token}) does not match the "
                        "constraint")
        self.matcher = matcher
        return None

    @property
    def compile_s(self) -> float:
        """Seconds a compile process spent on the grammar it waited for (0.0: taken from the cache, or not ended)."""
        future = self.future
        return future.compile_s if self.waited and future.done() and isinstance(future, CompileFuture) else 0.0

    @property
    def is_terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated
