"""replica/openai/malloc_arenas.py: a capped process, and the children it starts, allocate from at most
``ARENA_MAX`` malloc arenas however many threads allocate; a user's ``MALLOC_ARENA_MAX`` wins. Each case runs in a
process of its own (a cap cannot be undone), which counts its arenas with glibc's ``malloc_stats``."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys

import pytest
from kvmesh.replica.openai.malloc_arenas import ARENA_MAX

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="malloc arenas are glibc's")

THREADS = 8
PROBE = f"""
import ctypes, os, sys, threading
from kvmesh.replica.openai.malloc_arenas import cap_malloc_arenas

if sys.argv[1] == "cap":
    print("capped", cap_malloc_arenas(), os.environ.get("MALLOC_ARENA_MAX"), flush=True)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
held, barrier = [], threading.Barrier({THREADS})

def allocate():
    held.append(libc.malloc(1 << 16))  # each thread's first malloc picks (or makes) its arena
    barrier.wait()  # every thread alive at once: none hands its arena on

threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.stdout.flush()
libc.malloc_stats()  # to stderr: one "Arena N:" per arena
"""


def arenas(*mode: str, env: dict | None = None) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *mode], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | (env or {}))
    assert done.returncode == 0, done.stderr[-2000:]
    return len(re.findall(r"^Arena \d+:", done.stderr, re.M)), done.stdout


def test_threads_of_an_uncapped_process_make_arenas_of_their_own():
    """The control: what the cap is for (glibc gives each new thread an arena while under 8 per core)."""
    count, _ = arenas("none")
    assert count > ARENA_MAX + 1, count


def test_a_capped_process_allocates_from_at_most_the_cap():
    count, out = arenas("cap")
    assert out.startswith(f"capped True {ARENA_MAX}"), out
    assert count <= ARENA_MAX, count


def test_a_capped_process_passes_the_cap_to_the_processes_it_starts():
    grandchild = PROBE.replace('if sys.argv[1] == "cap"', 'if False')
    done = subprocess.run([sys.executable, "-c", "import subprocess, sys\n"
                           "from kvmesh.replica.openai.malloc_arenas import cap_malloc_arenas\n"
                           "cap_malloc_arenas()\n"
                           "sys.exit(subprocess.run([sys.executable, '-c', sys.argv[1], 'none']).returncode)",
                           grandchild], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(re.findall(r"^Arena \d+:", done.stderr, re.M)) <= ARENA_MAX


def test_a_users_malloc_arena_max_wins():
    count, out = arenas("cap", env={"MALLOC_ARENA_MAX": "6"})
    assert out.startswith("capped False 6"), out
    assert ARENA_MAX < count <= 6, count
