"""Fewer malloc arenas for kvmesh's serving processes: what a burst of large or odd requests frees stays reusable.

glibc's malloc gives threads that allocate at the same moment arenas of their own, up to 8 per core (16 on a
2-core machine). What a request decodes, renders, tokenizes or compiles on one thread is freed into that thread's
arena, where only the threads that later land on it reuse it; each arena keeps its own high-water mark, and the
process's resident memory creeps towards the sum of them. Measured on a router and two stories260K replicas, three
rounds of the hostile-fields attack (tests/security/noisy_attacker.py) after the noisy-neighbour warm-up, beside a
CPU-bound process, twice each way: malloc held 148 MB in use in each replica after every round, while its 16 arenas
spanned 290-320 MB and the replicas' resident memory rose 5-33 MB a round (the second round: 32 and 16 MB, 22 and 33
MB); capped at 2 arenas they spanned 236-249 MB, and the replicas rose 1-12 MB a round and ended about 45 MB smaller.

``cap_malloc_arenas`` sets the cap (``MALLOC_ARENA_MAX``) for this process, with ``mallopt`` (arenas already made
stay; no new ones past the cap), and in the environment its children inherit (router workers, compile processes,
and the Ray processes a local ``kvmesh serve`` starts, whose workers become the replicas). A ``MALLOC_ARENA_MAX`` the
user set wins: glibc read it when the process started, and it is passed on as it is. Where the C library has no
``mallopt`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ARENA_MAX = 2
"""Arenas a kvmesh process allocates from (glibc: the main arena and one more): two threads allocating at once take
one each; a third waits on a lock for the moment its ``malloc`` takes. Python code allocates under the GIL anyway."""
M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter number for the arena cap (malloc.h)."""


def cap_malloc_arenas(arena_max: int = ARENA_MAX) -> bool:
    """Cap this process's and its future children's malloc arenas (module doc); whether this process's cap was set
    here (False: the user's ``MALLOC_ARENA_MAX`` stands, or the C library has no ``mallopt``)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    os.environ["MALLOC_ARENA_MAX"] = str(arena_max)
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_ARENA_MAX, arena_max) == 1
