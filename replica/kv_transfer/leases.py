"""Leases on the holder: a prompt's cached leading blocks held for a peer to read, until released or expired.

    lease = leases.grant(manager, prompt, cache_salt, ttl_s)    # /kv/lease: blocks held (ref count +1)
    ...                                                          # the peer READs them by id
    leases.release(lease.lease_id)                               # /kv/release: blocks evictable again
    leases.expire()                                              # between steps: leases past their TTL end

A leased block is held in the block pool the way a running request holds it (``touch``: its ref count
rises, it leaves the free queue), so nothing evicts or overwrites it while a peer reads it. Everything
here runs on the engine thread (``AsyncLLM``'s commands and its between-step hook): never from HTTP.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from kvmesh.kvcache.block_pool import KVCacheBlock
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.replica.kv_transfer.prefix_pull import block_hasher, cached_prefix


@dataclass(frozen=True, slots=True)
class Lease:
    """What ``/kv/lease`` answers (``lease_id`` "" and no blocks: this replica holds none of the prompt)."""

    lease_id: str
    """The handle a peer releases it by."""
    remote_block_ids: list[int]
    """The held blocks' ids, the prompt's leading full blocks in order."""
    num_tokens: int
    """Tokens those blocks hold."""
    expires_in_s: float
    """Seconds until the lease ends on its own."""


@dataclass(slots=True)
class _Held:
    blocks: list[KVCacheBlock]
    expires_at: float


@dataclass(slots=True)
class LeaseTable:
    """The leases of one replica; ``released`` and ``expired`` count how leases ended."""

    released: int = 0
    expired: int = 0
    _held: dict[str, _Held] = field(default_factory=dict)

    @property
    def active(self) -> int:
        return len(self._held)

    def grant(self, manager: KVCacheManager, token_ids: list[int], cache_salt: str | None, ttl_s: float,
              now: float | None = None) -> Lease:
        """Hold the leading full blocks of ``token_ids`` this replica caches (device tier) for ``ttl_s``."""
        blocks = cached_prefix(manager, block_hasher(manager, token_ids, cache_salt, None).block_hashes)
        if not blocks:
            return Lease("", [], 0, ttl_s)
        manager.block_pool.touch(blocks)
        lease_id = secrets.token_hex(12)
        self._held[lease_id] = _Held(blocks, (time.monotonic() if now is None else now) + ttl_s)
        return Lease(lease_id, [b.block_id for b in blocks], len(blocks) * manager.block_size, ttl_s)

    def release(self, manager: KVCacheManager, lease_id: str) -> int | None:
        """Let the lease's blocks go; how many it held, or None when no such lease is live."""
        held = self._held.pop(lease_id, None)
        if held is None:
            return None
        manager.block_pool.free_blocks(reversed(held.blocks))
        self.released += 1
        return len(held.blocks)

    def expire(self, manager: KVCacheManager, now: float | None = None) -> int:
        """End every lease past its TTL (their blocks evictable again); how many ended."""
        now = time.monotonic() if now is None else now
        ended = [lease_id for lease_id, held in self._held.items() if held.expires_at <= now]
        for lease_id in ended:
            manager.block_pool.free_blocks(reversed(self._held.pop(lease_id).blocks))
        self.expired += len(ended)
        return len(ended)

    def next_expiry_s(self, now: float | None = None) -> float | None:
        """Seconds until the first lease expires (None: no lease)."""
        if not self._held:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, min(h.expires_at for h in self._held.values()) - now)
