"""The prefix walk in Python: the fallback of the compiled fast path (router/_native/fastpath.c), identical results.

Raw masks come in runs of equal values (a prefix shared by the same replicas); the running AND only
changes where a run starts, so it is taken once per run, in Python, while ``groupby`` finds the runs in C.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import groupby, repeat


def match_masks(blocks: dict[int, int], keys: Sequence[int], owners: Sequence[Hashable | None]) -> dict:
    """Per slot's owner (``owners[slot]``: a replica's id, or its host tier), the leading blocks of ``keys`` whose
    masks in ``blocks`` have its bit."""
    get = blocks.get
    if not keys or not get(keys[0]):
        return {}
    out: dict = {}  # lookups stop as soon as no replica is left
    end, held = 0, -1  # held: replicas holding every block so far (-1 = all bits)
    for mask, run in groupby(map(get, keys, repeat(0))):
        now_held = held & mask
        dropped = held & ~now_held if end else 0  # replicas whose chain ended at block `end`
        if dropped & (dropped - 1) == 0:
            if dropped:
                out[owners[dropped.bit_length() - 1]] = end
        else:
            while dropped:
                low = dropped & -dropped
                out[owners[low.bit_length() - 1]] = end
                dropped ^= low
        if not now_held:
            return out
        end += len(list(run))
        held = now_held
    while held:  # replicas holding the whole prompt
        low = held & -held
        out[owners[low.bit_length() - 1]] = end
        held ^= low
    return out
