"""What the replicas evict and whether it comes back: a bounded ghost list of evicted block hashes, fed by the
``BlockRemoved`` / ``BlockStored`` events the router already applies to its index.

A block a replica evicts becomes a *ghost* (its external hash only, no data). When a replica stores a block whose hash
is still a ghost, the block came back: the fleet recomputed (or pulled) something one of its caches had and lost,
there or on another replica (a request moved away from its prefix brings its blocks back elsewhere). The share of a
replica's stored blocks that come back this way (``comeback``, decayed over its last ``window_blocks`` stored blocks)
says how much reuse the caches are too small to keep: a new block placed there evicts one likely needed again. With
no eviction coming back (or none at all) ``comeback`` is 0.

The ghost list keeps the fleet's last ``capacity_blocks`` evictions per replica in the fleet (a re-store within about one
cache's worth of evictions counts; older ones are forgotten), so memory is bounded by ``capacity_blocks`` hashes per
replica. Host-tier events (``medium="CPU"``) are not the device caches' and are ignored. A block comes back on another
replica only where the replicas' external hashes of a block agree (engines hashing with the same seed); else only on
the replica that evicted it. The router keeps the list only for a policy that prices it (``Policy.tracks_evictions``:
``cache_aware_tokens`` with ``ghost_weight`` set); else no event pays for it. No peer router keeps this: Dynamo and llm-d read the same events only to know what is cached now.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvmesh.events.schema import HOST_MEDIUM, BlockRemoved, BlockStored
from kvmesh.router.replicas.load import ReplicaLoad

DEFAULT_GHOST_BLOCKS = 8192
"""Evicted block hashes kept per replica: many times a simulated replica's cache (687 blocks of 512 tokens on the Mooncake
trace at 16 replicas), so a re-store counts as coming back at any distance such a run reaches."""
DEFAULT_WINDOW_BLOCKS = 1024
"""Stored blocks over which ``comeback`` is averaged (exponentially: each stored block weighs ``1 / window``)."""


class EvictionGhosts:
    """The fleet's recent evictions (keys only); each replica's share of stores that re-store one of them is kept on
    its load record (``ReplicaLoad.comeback``, with its counts)."""

    def __init__(self, capacity_blocks: int = DEFAULT_GHOST_BLOCKS,
                 window_blocks: int = DEFAULT_WINDOW_BLOCKS) -> None:
        if capacity_blocks < 1 or window_blocks < 1:
            raise ValueError(f"capacity_blocks and window_blocks must be >= 1, got {capacity_blocks} and "
                             f"{window_blocks}")
        self.capacity_blocks = capacity_blocks
        """Evicted hashes kept per replica in the fleet."""
        self.rate = 1.0 / window_blocks
        """Weight of one stored block in ``comeback``."""
        self._ghosts: OrderedDict = OrderedDict()
        """Evicted external block hash -> None, the oldest eviction first."""

    def apply(self, load: ReplicaLoad, events: Iterable, num_replicas: int = 1) -> None:
        """Take one replica's events (device medium only) into its ``load.comeback``; ``num_replicas`` (the fleet's
        size) scales how many evictions are kept."""
        for event in events:
            kind = type(event)
            if kind is BlockRemoved and event.medium != HOST_MEDIUM:
                self._evicted(event.block_hashes, self.capacity_blocks * max(1, num_replicas))
            elif kind is BlockStored and event.medium != HOST_MEDIUM:
                self._stored(load, event.block_hashes)
        # a reset (AllBlocksCleared) evicts nothing: what it dropped is not a ghost

    def _evicted(self, hashes: Iterable, cap: int) -> None:
        ghosts = self._ghosts
        for h in hashes:
            ghosts[h] = None
            ghosts.move_to_end(h)
        while len(ghosts) > cap:
            ghosts.popitem(last=False)

    def _stored(self, load: ReplicaLoad, hashes: Iterable) -> None:
        ghosts, rate, share = self._ghosts, self.rate, load.comeback
        for h in hashes:
            back = ghosts.pop(h, 0) is None
            share += rate * ((1.0 if back else 0.0) - share)
            load.came_back_blocks += back
            load.stored_blocks += 1
        load.comeback = share

    @property
    def num_ghosts(self) -> int:
        """Evicted hashes held now."""
        return len(self._ghosts)
