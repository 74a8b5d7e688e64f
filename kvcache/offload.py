"""The device cache's side of the host tier (vLLM's ``OffloadingManager``): which blocks go down,
which come back, and when a copy counts as landed.

The KV cache manager calls it while scheduling; what it decides leaves with the step as
``OffloadCopies`` (kvcache/offload_copies.py) and comes back as the ids of the steps whose stores the
runner saw land (``complete``). A device block being copied down keeps one extra reference until
then, so the pool never hands it out, and nothing ever waits for a copy to free a block.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.block_pool import BlockPool
from kvmesh.kvcache.hashing import BlockHash
from kvmesh.kvcache.host_tier import HostTier
from kvmesh.kvcache.offload_copies import OffloadCopies


@dataclass(slots=True)
class OffloadStats:
    """Cumulative counters of the host tier, in blocks."""

    hit_blocks: int = 0
    """Blocks found in the host tier past the device's own prefix (loaded back)."""
    stored_blocks: int = 0
    """Blocks copied down (landed)."""
    loaded_blocks: int = 0
    """Blocks copied back up (same as ``hit_blocks`` once the loads ran)."""


class OffloadingManager:
    """Plans one step's copies between ``device`` and ``host``; see the module docstring."""

    def __init__(self, device: BlockPool, host: HostTier):
        self.device = device
        self.host = host
        self.stats = OffloadStats()
        self._loads: list[tuple[int, int]] = []
        self._stores: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        self._next_id = 0
        self.pending: dict[int, list[tuple[KVCacheBlock, KVCacheBlock]]] = {}
        """Job id -> its stores ``(device block, host block)`` not yet reported landed."""

    def lookup(self, block_hashes: list[BlockHash], start: int, stop: int) -> list[KVCacheBlock]:
        """Host blocks continuing a device prefix of ``start`` blocks, up to block ``stop``."""
        return self.host.lookup(block_hashes, start, stop)

    def plan_loads(self, host_blocks: list[KVCacheBlock], device_blocks: list[KVCacheBlock]) -> None:
        """Copy ``host_blocks`` into the freshly allocated ``device_blocks`` before this step's forward."""
        self.host.touch(host_blocks)
        self._loads += [(h.block_id, d.block_id) for h, d in zip(host_blocks, device_blocks, strict=True)]
        self.stats.hit_blocks += len(host_blocks)

    def plan_stores(self, cached: list[KVCacheBlock]) -> None:
        """Copy down the device blocks just cached whose content the tier does not hold yet."""
        holds = self.host.holds
        sources = [b for b in cached if b.block_hash is not None and not holds(b.block_hash)]
        if not sources:
            return
        targets = self.host.reserve(sources)
        for source in sources[:len(targets)]:
            source.ref_cnt += 1  # held until the copy landed (released in ``complete``)
        self._stores += zip(sources, targets, strict=False)

    def take(self) -> OffloadCopies | None:
        """This step's copies (None when there are none); their stores become pending."""
        if not self._loads and not self._stores:
            return None
        job_id, self._next_id = self._next_id, self._next_id + 1
        out = OffloadCopies(job_id, self._loads,
                          [(d.block_id, h.block_id) for d, h in self._stores])
        self.stats.loaded_blocks += len(self._loads)
        if self._stores:
            self.pending[job_id] = self._stores
        self._loads, self._stores = [], []
        return out

    def complete(self, job_ids: list[int]) -> None:
        """The runner saw these steps' stores land: host copies become findable, device holds drop."""
        for job_id in job_ids:
            stores = self.pending.pop(job_id, None)
            if not stores:
                continue
            sources = [d for d, _ in stores]
            self.host.commit(sources, [h for _, h in stores])
            self.device.free_blocks(sources)
            self.stats.stored_blocks += len(stores)

    def cancel(self, job_ids: list[int]) -> None:
        """These steps' stores will never land (the runner failed the step): forget them."""
        for job_id in job_ids:
            stores = self.pending.pop(job_id, None)
            if stores:
                sources = [d for d, _ in stores]
                self.host.cancel(sources, [h for _, h in stores])
                self.device.free_blocks(sources)

    def held_device_blocks(self) -> list[KVCacheBlock]:
        """Device blocks holding a reference for a copy still planned or in flight (integrity checks)."""
        held = [d for d, _ in self._stores]
        for stores in self.pending.values():
            held += [d for d, _ in stores]
        return held
