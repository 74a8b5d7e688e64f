"""Rendezvous (highest-random-weight) hashing of a prompt's prefix over replica ids: the same key picks the same
replica out of the same set on every router, in every process (no salted ``hash()``), and different keys spread
evenly over the set. The default policy's ``near_pick="prefix_hash"`` uses it among the near-equal cheapest
candidates, so routers deciding inside one burst send requests sharing a new prefix to one replica."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.tier_matches import Matches

MASK = (1 << 64) - 1
_ID_HASHES: dict[str, int] = {}
_ID_HASHES_BOUND = 65_536


def mix64(x: int) -> int:
    """splitmix64's finaliser: a 64-bit integer's bits spread over all 64."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK
    return x ^ (x >> 31)


def id_hash(replica: Replica) -> int:
    """A replica's id's stable 64-bit hash (blake2b; memoised, the memo bounded)."""
    h = _ID_HASHES.get(replica.id)
    if h is None:
        h = int.from_bytes(hashlib.blake2b(replica.id.encode(), digest_size=8).digest(), "little")
        if len(_ID_HASHES) >= _ID_HASHES_BOUND:
            _ID_HASHES.clear()
        _ID_HASHES[replica.id] = h
    return h


def new_prefix_key(request_keys: Sequence[int], matches: Matches) -> int:
    """The key of the prompt's first block no candidate holds (past the longest match), or its last block where one
    holds it all; 0 for an empty prompt. Requests sharing a cached head and a new part hash alike by the new part."""
    if not request_keys:
        return 0
    held = max(matches.values(), default=0)
    return int(request_keys[min(held, len(request_keys) - 1)]) & MASK


def rendezvous(key: int, replicas: Sequence[Replica]) -> int:
    """The position in ``replicas`` whose id's hash with ``key`` is highest (ties: the first)."""
    k = mix64(key)
    best, best_score = 0, -1
    for i, replica in enumerate(replicas):
        score = mix64(k ^ id_hash(replica))
        if score > best_score:
            best, best_score = i, score
    return best
