"""Whether a replica is evicting: the share of the device blocks it stored lately that pushed a cached block out,
from the ``BlockStored`` / ``BlockRemoved`` events the router applies to its index (``ReplicaLoad.evicting``).

While a replica's cache fills, a block it stores takes a free block and its events remove nothing: the share is 0.
Once the cache is full every block stored evicts one (a ``BlockRemoved`` of the least recently used free block), and
the share nears 1. Both counts decay per block stored (``window_blocks``: about the last that many blocks), so the
share follows a replica from filling to full within a window's stores; a reset (``AllBlocksCleared``) empties its
cache and zeroes both. Host-tier events (``medium="CPU"``) are not the device cache's and are ignored. The default
policy prices a replica's turnover only as far as it is evicting, and a fleet's queued prefill at full weight while
it fills (router/routing/policies/cache_aware_tokens.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvmesh.events.schema import HOST_MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored
from kvmesh.router.replicas.load import ReplicaLoad

EVICTING_WINDOW_BLOCKS = 64
"""Stored blocks over which ``ReplicaLoad.evicting`` is taken (each weighs ``1 / window`` against the older)."""


def apply_evictions(load: ReplicaLoad, events: Iterable, window_blocks: int = EVICTING_WINDOW_BLOCKS) -> None:
    """Take one replica's events (device medium only) into ``load.evicting``."""
    sums = load.evict_sums
    stored, removed, new_stored, new_removed = sums[0], sums[1], 0, 0
    for event in events:  # one batch is one step: its removals and stores count together, whatever their order
        kind = type(event)
        if kind is BlockStored and event.medium != HOST_MEDIUM:
            new_stored += len(event.block_hashes)
        elif kind is BlockRemoved and event.medium != HOST_MEDIUM:
            new_removed += len(event.block_hashes)
        elif kind is AllBlocksCleared:
            stored = removed = 0.0
            new_stored = new_removed = 0
    decay = (1.0 - 1.0 / window_blocks) ** new_stored if new_stored else 1.0
    stored, removed = stored * decay + new_stored, removed * decay + new_removed
    sums[0], sums[1] = stored, removed
    share = (removed / stored if removed < stored else 1.0) if stored > 0 else 0.0
    if share != load.evicting:  # set only on a change: a set field marks the replica's load row stale
        load.evicting = share
