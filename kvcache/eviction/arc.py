"""ARC-style adaptive segmented LRU: the split between once-used and reused blocks learns from misses.

SLRU (slru.py) always evicts never-hit blocks first. That wins when one-off prompts flood the
cache, but loses when reuse comes *late*: on the Mooncake trace a conversation's next turn often
arrives after many other requests, by when SLRU has already evicted the first turn from its small
probation segment. ARC (Megiddo & Modha, FAST'03) fixes exactly this with ghost lists: it
remembers the hashes it recently evicted from each segment, and a request that recomputes one of
them is proof that segment was too small, so the target size moves toward it::

    T1 probation (free, never hit)  <- target size p ->  T2 protected (free, hit at least once)
    B1 ghost: hashes evicted from T1                      B2 ghost: hashes evicted from T2
    recomputed block in B1: p += max(1, |B2|/|B1|)        recomputed block in B2: p -= max(1, |B1|/|B2|)
    evict from T1 while |T1| > p, else from T2            a ghost hit is reused content: it joins T2

Everything stays O(1): the segments are the pool's intrusive free queues, the ghosts are insertion
ordered dicts trimmed from the front; the pool calls ``on_cached`` once per step with the blocks
it just cached. Only free blocks are ordered here; blocks in use are pinned by the pool.
"""

from __future__ import annotations

from collections import OrderedDict

from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.eviction.segmented import SegmentedEvictionPolicy
from kvmesh.kvcache.hashing import BlockHash


class ARCEvictionPolicy(SegmentedEvictionPolicy):
    """Adaptive frequency-aware eviction (see the module docstring)."""

    name = "arc"
    wants_on_cached = True

    def __init__(self, blocks: list[KVCacheBlock], num_blocks: int, ghost_fraction: float = 1.0):
        if ghost_fraction <= 0:
            raise ValueError(f"ghost_fraction must be positive, got {ghost_fraction}")
        self.capacity = num_blocks - 1
        """Usable blocks of the pool (ARC's c)."""
        self.ghost_capacity = max(1, int(ghost_fraction * self.capacity))
        """Most hashes each ghost list remembers."""
        self.target_probation = 0.0
        """ARC's p: how many free blocks the probation segment may keep before T2 is evicted."""
        super().__init__(blocks)
        # OrderedDict: popitem(last=False) is O(1); deleting a plain dict's first key is not
        # (iteration walks the deleted slots left at the front).
        self.ghost_probation: OrderedDict[BlockHash, None] = OrderedDict()
        self.ghost_protected: OrderedDict[BlockHash, None] = OrderedDict()

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        probation, protected = self.probation, self.protected
        if n > probation.num_free_blocks + protected.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        # T1 down to its target first, then T2, then T1 again if T2 ran dry.
        first = min(n, max(0, probation.num_free_blocks - int(self.target_probation)))
        second = min(n - first, protected.num_free_blocks)
        out = probation.popleft_n(first)
        if second:
            taken = protected.popleft_n(second)
            self._remember(taken, self.ghost_protected)
            for block in taken:
                block.protected = False
            out += taken
        if n - first - second:
            out += probation.popleft_n(n - first - second)
        self._remember(out[:first], self.ghost_probation)
        self._remember(out[first + second :], self.ghost_probation)
        return out

    def _remember(self, blocks: list[KVCacheBlock], ghost: OrderedDict[BlockHash, None]) -> None:
        for block in blocks:
            if block.block_hash is not None:
                ghost[block.block_hash] = None
        while len(ghost) > self.ghost_capacity:
            ghost.popitem(last=False)

    def on_cached(self, blocks: list[KVCacheBlock]) -> None:
        b1, b2 = self.ghost_probation, self.ghost_protected
        if not b1 and not b2:
            return
        for block in blocks:
            h = block.block_hash
            if h in b1:
                self.target_probation = min(self.capacity, self.target_probation + max(1.0, len(b2) / len(b1)))
                del b1[h]
                block.hit_count = max(block.hit_count, 1)
            elif h in b2:
                self.target_probation = max(0.0, self.target_probation - max(1.0, len(b1) / len(b2)))
                del b2[h]
                block.hit_count = max(block.hit_count, 1)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        hot = [b for b in blocks if b.hit_count and b.block_hash is not None]
        if not hot:
            self.probation.append_n(blocks)
            return
        for block in hot:
            block.protected = True
        if len(hot) < len(blocks):
            self.probation.append_n([b for b in blocks if not (b.hit_count and b.block_hash is not None)])
        self.protected.append_n(hot)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        first = max(0, self.probation.num_free_blocks - int(self.target_probation))
        t1 = self.probation.get_all_free_blocks()
        return t1[:first] + self.protected.get_all_free_blocks() + t1[first:]

    def reset(self) -> None:
        super().reset()
        self.ghost_probation.clear()
        self.ghost_protected.clear()
        self.target_probation = 0.0
