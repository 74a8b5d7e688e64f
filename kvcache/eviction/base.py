"""The interface between the block pool and an eviction policy.

The pool owns ref counts and the hash map; a policy only orders the *free* blocks (ref_cnt == 0),
which stay cached and findable until the policy hands them out again. Evicting a block lazily,
at the moment ``popleft_n`` returns it, is the pool's job.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from kvmesh.kvcache.block import KVCacheBlock


class EvictionPolicy(ABC):
    """Orders the free blocks of a pool; every operation must be O(1) per block."""

    name: str = ""
    """Registry name (``eviction_policy=`` of the pool)."""
    if TYPE_CHECKING:  # an attribute (LRU) or a property (the segmented ones)
        @property
        def num_free_blocks(self) -> int:
            """Number of free blocks the policy holds."""
    wants_on_cached: bool = False
    """Whether the pool should call ``on_cached`` (off by default: it costs a call per step)."""

    @abstractmethod
    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Removes and returns ``n`` free blocks to reuse, best victims first."""

    @abstractmethod
    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Takes blocks whose ref count dropped to zero; the first of them should go first."""

    @abstractmethod
    def remove(self, block: KVCacheBlock) -> None:
        """Takes ``block`` out of the free set (a prefix-cache hit revived it)."""

    @abstractmethod
    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every free block in the order the policy would hand them out (tests; O(n))."""

    def reset(self) -> None:
        """The cache was cleared: forget any per-block history (blocks stay free)."""
        return None  # stateless policies have nothing to forget

    def on_cached(self, blocks: list[KVCacheBlock]) -> None:
        """``blocks`` (in use) just got their hashes; called only if ``wants_on_cached``."""
        return None
