"""One compile process of the engine's grammar pool (engine/grammar_pool.py): it builds xgrammar's compiler for the
model's tokenizer once, then compiles one constraint at a time as the pool sends them:

    pool -> worker   (job id, StructuredOutputsParams)
    worker -> pool   ("ready",) once; then per job (job id, the CompiledGrammar as JSON | None, error | None, seconds)

Its module is preloaded by the fork server (xgrammar and torch imported once), so a new worker starts in
milliseconds. It dies with its parent (Linux's parent-death signal), so a replica killed mid-compile leaves no compile
behind; the pool kills it when a compile overruns or
every request waiting for it is gone.
"""

from __future__ import annotations

import ctypes
import signal
import time
from typing import TYPE_CHECKING

import xgrammar  # noqa: F401  (imported here so the fork server preloads it)
from kvmesh.replica.engine.xgrammar_backend import XgrammarCompiler, error_message, tokenizer_info_from_json

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pool's kill and the closed pipe are the only ends
        pass


def serve(conn: Connection, tokenizer_info: str, whitespace_default: bool, cache_limit_bytes: int) -> None:
    """The worker's loop (module doc) until its pipe closes."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the replica's to handle; it ends the pool
    compiler = XgrammarCompiler(tokenizer_info_from_json(tokenizer_info), whitespace_default, cache_limit_bytes)
    conn.send(("ready",))
    while True:
        try:
            job_id, params = conn.recv()
        except (EOFError, OSError):
            return
        start = time.monotonic()
        try:
            result, error = compiler.compile(params).serialize_json(), None
        except Exception as e:  # xgrammar's parser and compiler errors: the request's
            result, error = None, error_message(e)
        conn.send((job_id, result, error, time.monotonic() - start))
