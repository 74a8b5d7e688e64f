"""Eviction policies for the block pool's free blocks, by name (``BlockPool(eviction_policy=...)``).

A new policy is one file and one line in ``EVICTION_POLICIES``.
"""

from __future__ import annotations

from collections.abc import Callable

from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.eviction.arc import ARCEvictionPolicy
from kvmesh.kvcache.eviction.base import EvictionPolicy
from kvmesh.kvcache.eviction.lru import LRUEvictionPolicy
from kvmesh.kvcache.eviction.slru import SLRUEvictionPolicy

EvictionPolicyKwargs = dict[str, float]
"""A policy's tuning numbers by keyword (``protected_fraction=0.8``, ``ghost_fraction=1.0``, ...)."""

# Each takes (blocks, num_blocks, **its own tuning numbers): a class per policy, so no one signature for all.
EVICTION_POLICIES: dict[str, Callable[..., EvictionPolicy]] = {
    LRUEvictionPolicy.name: LRUEvictionPolicy,
    SLRUEvictionPolicy.name: SLRUEvictionPolicy,
    ARCEvictionPolicy.name: ARCEvictionPolicy,
}


def make_eviction_policy(name: str, blocks: list[KVCacheBlock], num_blocks: int,
                         **kwargs: float) -> EvictionPolicy:
    """The policy called ``name`` holding ``blocks`` (initially free) of a pool of ``num_blocks``."""
    try:
        cls = EVICTION_POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of {sorted(EVICTION_POLICIES)}"
        ) from None
    return cls(blocks, num_blocks, **kwargs)


__all__ = ["ARCEvictionPolicy", "EVICTION_POLICIES", "EvictionPolicy", "EvictionPolicyKwargs", "LRUEvictionPolicy",
           "SLRUEvictionPolicy", "make_eviction_policy"]
