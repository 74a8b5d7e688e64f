"""The grammar compile processes of a replica (engine/grammar_pool.py): its children running
engine/grammar_worker.py, read with psutil (tests of compiles stopped, cancelled and gone)."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

WORKER_MODULE = "kvmesh.replica.engine.grammar_worker"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_compile_process(p: psutil.Process) -> bool:
    try:
        return WORKER_MODULE in p.cmdline()
    except psutil.Error:
        return False


def _descendants(root: psutil.Process) -> list[psutil.Process]:
    """Every process below ``root``, found by parent pid alone.

    Not ``Process.children``: it drops a child whose start time reads earlier than its parent's, and both times add
    the kernel's boot time, read afresh each time, which can move by a second between reads. A compile process
    started within a second of its parent was then missing now and then."""
    by_parent: dict[int, list[psutil.Process]] = {}
    for p in psutil.process_iter(["ppid"]):
        by_parent.setdefault(p.info["ppid"], []).append(p)
    found, stack = [], [root.pid]
    while stack:
        for child in by_parent.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return found


def compile_workers(root: psutil.Process | None = None) -> list[psutil.Process]:
    """The live compile processes under ``root`` (None: this process)."""
    return [w for w in _descendants(root or psutil.Process()) if _is_compile_process(w) and _alive(w)]


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
    """Resident bytes of ``root`` and every process under it (found by parent pid: ``_descendants``; a compile
    process missed at one reading and counted at the next read as 180 MB more)."""
    total = 0
    for p in [root, *_descendants(root)]:
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
