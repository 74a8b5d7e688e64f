"""One compile process of the engine's grammar pool (engine/grammar_pool.py), a program of its own:

    python -m kvmesh.replica.engine.grammar_worker FD      (FD: its end of a socket pair to the pool)

It is lean on purpose: a new process is what a first constrained request waits for, so it loads xgrammar's
compiler and nothing else -- not xgrammar's Python package (which imports torch, transformers and pydantic, about
5 s of CPU on a small machine), not torch (which tvm_ffi, xgrammar's binding layer, imports when it can), not the
replica's modules, and not the replica's main module (what a multiprocessing child would import again). It calls
xgrammar's native API (``xgrammar.tvm_ffi_binding``) the way xgrammar's Python classes do. It starts in about
0.3 s of CPU, against about 5 s for one that imports ``xgrammar``.

    pool -> worker   (tokenizer info JSON, cache limit bytes) once; then (job id, kind, text, any whitespace)
                     (engine/grammar_text.py's ``compile_job``)
    worker -> pool   ("ready",) once; then per job (job id, the CompiledGrammar as JSON | None, error | None, seconds)

It runs at a lower CPU priority than the engine (``NICENESS``), and dies with its parent (Linux's parent-death
signal), so a replica killed mid-compile leaves no compile behind; the pool kills it when a compile overruns or every
request waiting for it is gone.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import socket
import sys
import time
import types
from multiprocessing.connection import Connection

from kvmesh.replica.engine.grammar_text import json_strings_repaired

_PR_SET_PDEATHSIG = 1
NICENESS = 10
"""Added to the process's nice value from its start: where CPUs are short, the engine's steps (every tenant's
tokens) come before a compile, and before a compile process starting to replace one killed. One tenant's flood of
slow constraints keeps both compile processes busy and restarting (about 0.3 s of CPU each time). Measured with
tests/security/test_grammar_flood_live.py's flood on a 2-core machine beside a CPU-bound process, three rounds each
way, interleaved: the light tenant's p90 during the flood was 0.14, 0.18 and 0.17 s at the engine's priority, 0.10,
0.11 and 0.09 s niced (its p90 alone: 0.04-0.08 s), and its own constrained request waited as long (0.5-0.7 s). A
compile still gets the CPU whenever the engine waits (between its steps, or with nothing to run)."""
BLOCKED = ("torch", "numpy", "transformers", "pydantic")
"""Modules this process never imports (tvm_ffi takes torch and numpy only when they import)."""


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pool's kill and the closed pipe are the only ends
        pass


def block_heavy_imports() -> None:
    """``import torch`` (and the rest of ``BLOCKED``) raises ImportError from now on in this process, unless it
    was imported already (the compile process's own start only: a library that tries them goes on without)."""
    for name in BLOCKED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "import name" raises ImportError


def native_api():
    """xgrammar's native API module, without running ``xgrammar/__init__.py`` where it did not run yet: the
    package is entered as a bare package (its own path, no code), then only its binding loader and binding stubs
    are imported."""
    if "xgrammar" not in sys.modules:
        spec = importlib.util.find_spec("xgrammar")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("xgrammar is not installed")
        package = types.ModuleType("xgrammar")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["xgrammar"] = package
    import xgrammar.load_binding  # noqa: F401  (the native library first: the stubs register its types)
    from xgrammar.tvm_ffi_binding import _ffi_api

    return _ffi_api


class LeanCompiler:
    """Compiles (kind, text, any whitespace) jobs for one tokenizer with xgrammar's native compiler, as
    engine/xgrammar_backend.py's ``XgrammarCompiler`` does through xgrammar's Python classes."""

    def __init__(self, core, tokenizer_info: str, cache_limit_bytes: int) -> None:
        self._core = core
        info = core.TokenizerInfo.deserialize_json(tokenizer_info)
        try:  # 1 thread, cache on, every mask built at compile time (xgrammar 0.2.9 added that last argument)
            self._compiler = core.GrammarCompiler(info, 1, True, cache_limit_bytes, False)
        except TypeError:  # xgrammar 0.2.8 and before: four arguments, masks always built at compile time
            self._compiler = core.GrammarCompiler(info, 1, True, cache_limit_bytes)

    def compile(self, kind: str, text: str, ws: bool) -> str:
        """The compiled grammar as JSON (``CompiledGrammar.serialize_json``)."""
        c = self._compiler
        if kind == "json":  # Grammar.from_json_schema(text, any_whitespace=ws): indent, separators, strict, ...
            grammar = self._core.Grammar.from_json_schema(text, ws, None, None, True, None, False, False)
            repaired = json_strings_repaired(str(grammar.to_string()))
            if repaired is not None:
                grammar = self._core.Grammar.from_ebnf(repaired, "root")
            compiled = c.compile_grammar_ebnf(grammar)
        elif kind == "json_object":
            compiled = c.compile_json_schema('{"type": "object"}', ws, None, None, True, None, False)
        elif kind == "regex":
            compiled = c.compile_regex(text)
        elif kind == "grammar":
            compiled = c.compile_grammar_from_strings(text, "root")
        else:
            raise ValueError(f"unknown constraint kind {kind!r}")
        return str(compiled.serialize_json())


def serve(conn: Connection) -> None:
    """The worker's loop (module doc) until its pipe closes."""
    tokenizer_info, cache_limit_bytes = conn.recv()
    compiler = LeanCompiler(native_api(), tokenizer_info, cache_limit_bytes)
    conn.send(("ready",))
    while True:
        try:
            job_id, kind, text, ws = conn.recv()
        except (EOFError, OSError):
            return
        start = time.monotonic()
        try:
            result, error = compiler.compile(kind, text, ws), None
        except Exception as e:  # xgrammar's parser and compiler errors: the request's
            result, error = None, str(e)
        conn.send((job_id, result, error, time.monotonic() - start))


def main(argv: list[str]) -> None:
    _die_with_parent()
    os.nice(NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the replica's to handle; it ends the pool
    block_heavy_imports()
    sock = socket.socket(fileno=int(argv[0]))
    serve(Connection(sock.detach()))


if __name__ == "__main__":
    main(sys.argv[1:])
