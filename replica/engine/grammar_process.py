"""A grammar compile process from the pool's side (engine/grammar_pool.py): started as its own program
(engine/grammar_worker.py) over a socket pair, sent its tokenizer, and killed (then replaced by the pool) when its
compile overruns or loses its requests.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from multiprocessing.connection import Connection


class CompileProcess:
    """One compile process as the pool's dispatcher sees it: its pipe, whether it said ready, the job it runs."""

    __slots__ = ("process", "conn", "ready", "job")

    def __init__(self, process: subprocess.Popen, conn: Connection) -> None:
        self.process, self.conn, self.ready, self.job = process, conn, False, None

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:  # unkillable for now (stopped in the kernel): left to its parent-death
            pass
        self.conn.close()
        self.job = None


def start_worker(tokenizer_info: str, cache_limit_bytes: int) -> CompileProcess:
    """A compile process (engine/grammar_worker.py), sent its tokenizer; it says ``("ready",)`` once it can compile.
    A plain ``python -m``, not a multiprocessing child: those import the parent's main module again first."""
    ours, theirs = socket.socketpair()
    try:
        process = subprocess.Popen([sys.executable, "-m", "kvmesh.replica.engine.grammar_worker",
                                    str(theirs.fileno())], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                   close_fds=True)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    conn.send((tokenizer_info, cache_limit_bytes))
    return CompileProcess(process, conn)
