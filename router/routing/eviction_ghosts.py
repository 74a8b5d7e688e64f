"""What the replicas evict and whether it comes back: a bounded ghost list of evicted block hashes, fed by the
``BlockRemoved`` / ``BlockStored`` events the router already applies to its index.

A block a replica evicts becomes a *ghost* (its external hash only, no data). When a replica stores a block whose hash
is still a ghost, the block came back: the fleet recomputed (or pulled) something one of its caches had and lost,
there or on another replica (a request moved away from its prefix brings its blocks back elsewhere). The share of a
replica's stored blocks that come back this way (``comeback``, decayed over its last ``window_blocks`` stored blocks)
says how much reuse the caches are too small to keep: a new block placed there evicts one likely needed again. With
no eviction coming back (or none at all) ``comeback`` is 0.

Each replica's ghost list is as deep as its cache (ARC's ghost lists): its last ``num_kv_blocks`` evictions (as its
``/load`` reports, less the null block; ``capacity_blocks`` until it reports one), so a block comes back when it is
stored again within about one cache's worth of its evicting replica's evictions, a reuse a cache that size could
have kept. Memory is bounded by the fleet's cache blocks in hashes. Host-tier events (``medium="CPU"``) are not the
device caches' and are ignored. A block comes back on another replica only where the replicas' external hashes of a
block agree (engines hashing with the same seed); else only on the replica that evicted it. The router keeps the
lists only for a policy that prices them (``Policy.tracks_evictions``: ``cache_aware_tokens`` with ``ghost_weight``
set); else no event pays for them. No peer router keeps this: Dynamo and llm-d read the same events only to know
what is cached now.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvmesh.events.schema import HOST_MEDIUM, BlockRemoved, BlockStored
from kvmesh.router.replicas.load import ReplicaLoad

DEFAULT_GHOST_BLOCKS = 8192
"""Evicted block hashes kept for a replica that has not reported its cache size (``num_kv_blocks``) yet."""
DEFAULT_WINDOW_BLOCKS = 1024
"""Stored blocks over which ``comeback`` is averaged (exponentially: each stored block weighs ``1 / window``)."""


class EvictionGhosts:
    """The fleet's ghosts: each replica's recent evictions (keys only, one cache deep, on its load record:
    ``ReplicaLoad.evicted``); each replica's share of stores that re-store one of them is kept on its load record too
    (``ReplicaLoad.comeback``, with its counts)."""

    def __init__(self, capacity_blocks: int = DEFAULT_GHOST_BLOCKS,
                 window_blocks: int = DEFAULT_WINDOW_BLOCKS) -> None:
        if capacity_blocks < 1 or window_blocks < 1:
            raise ValueError(f"capacity_blocks and window_blocks must be >= 1, got {capacity_blocks} and "
                             f"{window_blocks}")
        self.capacity_blocks = capacity_blocks
        """Evicted hashes kept for a replica that reported no cache size."""
        self.rate = 1.0 / window_blocks
        """Weight of one stored block in ``comeback``."""
        self._held: dict[object, list[OrderedDict]] = {}
        """Evicted hash -> the ghost lists holding it (a store of it, on any replica, is a comeback)."""

    def apply(self, load: ReplicaLoad, events: Iterable) -> None:
        """Take one replica's events (device medium only) into its ghost list and its ``load.comeback``."""
        for event in events:
            kind = type(event)
            if kind is BlockRemoved and event.medium != HOST_MEDIUM:
                cap = load.num_kv_blocks - 1 if load.num_kv_blocks > 1 else self.capacity_blocks  # less the null block
                self._evicted(load.evicted, event.block_hashes, cap)
            elif kind is BlockStored and event.medium != HOST_MEDIUM:
                self._stored(load, event.block_hashes)
        # a reset (AllBlocksCleared) evicts nothing: what it dropped is not a ghost

    def forget(self, load: ReplicaLoad) -> None:
        """Drop a replica's ghost list (it left the fleet)."""
        for h in load.evicted:
            self._release(h, load.evicted)
        load.evicted.clear()

    def _evicted(self, ghosts: OrderedDict, hashes: Iterable, cap: int) -> None:
        held = self._held
        for h in hashes:
            if h in ghosts:
                ghosts.move_to_end(h)
            else:
                ghosts[h] = None
                held.setdefault(h, []).append(ghosts)
        while len(ghosts) > cap:
            self._release(ghosts.popitem(last=False)[0], ghosts)

    def _release(self, h, ghosts: OrderedDict) -> None:
        """``ghosts`` no longer holds ``h``."""
        lists = self._held[h]
        for i, other in enumerate(lists):
            if other is ghosts:  # the same list (two lists holding the same hashes compare equal)
                del lists[i]
                break
        if not lists:
            del self._held[h]

    def _stored(self, load: ReplicaLoad, hashes: Iterable) -> None:
        rate, share, held = self.rate, load.comeback, self._held
        for h in hashes:
            lists = held.pop(h, None)
            back = lists is not None
            if back:  # its ghosts consumed, in every list holding one
                for ghosts in lists:
                    del ghosts[h]
            share += rate * ((1.0 if back else 0.0) - share)
            load.came_back_blocks += back
            load.stored_blocks += 1
        load.comeback = share

    @property
    def num_ghosts(self) -> int:
        """Evicted hashes held now (once each, whichever lists hold them)."""
        return len(self._held)
