"""The grammar compile processes of a replica (engine/grammar_pool.py): the children of its multiprocessing fork
server, read with psutil (tests of compiles stopped, cancelled and gone)."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_fork_server(p: psutil.Process) -> bool:
    try:
        return "multiprocessing.forkserver" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def compile_workers(root: psutil.Process | None = None) -> list[psutil.Process]:
    """The live compile processes under ``root`` (None: this process)."""
    root = root or psutil.Process()
    try:
        servers = [p for p in root.children(recursive=True) if _is_fork_server(p)]
        return [w for s in servers for w in s.children() if _alive(w)]
    except psutil.Error:
        return []


def busy_seconds(processes: list[psutil.Process]) -> float:
    """CPU seconds ``processes`` have used so far (those gone count 0)."""
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def tree_rss(root: psutil.Process) -> int:
    """Resident bytes of ``root`` and every process under it."""
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
