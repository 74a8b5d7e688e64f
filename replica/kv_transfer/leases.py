"""Leases on the holder: a prompt's cached leading blocks held for a peer to read, until released or expired.

    lease = leases.grant(manager, prompt, cache_salt, ttl_s)    # /kv/lease: blocks held (ref count +1)
    ...                                                          # the peer READs them by id
    leases.release(lease.lease_id)                               # /kv/release: blocks evictable again
    leases.expire()                                              # between steps: leases past their TTL end

A leased block is held in the block pool the way a running request holds it (``touch``: its ref count
rises, it leaves the free queue), so nothing evicts or overwrites it while a peer reads it. Past the
device's own prefix a lease goes on into the host tier (kvcache/offload.py), holding those host blocks
the same way in the tier's pool; the answer says which ids are host ids (``remote_block_media``). Everything
here runs on the engine thread (``AsyncLLM``'s commands and its between-step hook): never from HTTP.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from kvmesh.events.schema import DEVICE_MEDIUM, HOST_MEDIUM
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
    num_host_blocks: int = 0
    """How many of ``remote_block_ids`` (the last ones) are host-tier block ids: evicted from the device, kept
    in host memory; a puller reads them from the holder's host tier."""

    @property
    def remote_block_media(self) -> list[str]:
        """The tier of each of ``remote_block_ids``, in the events' values (``"GPU"``, then ``"CPU"``)."""
        n = len(self.remote_block_ids)
        return [DEVICE_MEDIUM] * (n - self.num_host_blocks) + [HOST_MEDIUM] * self.num_host_blocks


@dataclass(slots=True)
class _Held:
    blocks: list[KVCacheBlock]
    host_blocks: list[KVCacheBlock]
    expires_at: float

    def let_go(self, manager: KVCacheManager) -> None:
        manager.block_pool.free_blocks(reversed(self.blocks))
        if self.host_blocks:
            manager.offload.host.pool.free_blocks(reversed(self.host_blocks))


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
        """Hold the leading full blocks of ``token_ids`` this replica caches for ``ttl_s``: the device tier's, then
        the host tier's that continue them (blocks the device evicted but host memory kept)."""
        hashes = block_hasher(manager, token_ids, cache_salt, None).block_hashes
        blocks = cached_prefix(manager, hashes)
        host = [] if manager.offload is None else manager.offload.lookup(hashes, len(blocks), len(hashes))
        if not blocks and not host:
            return Lease("", [], 0, ttl_s)
        manager.block_pool.touch(blocks)
        if host:
            manager.offload.host.pool.touch(host)  # not evictable from the tier while leased
        lease_id = secrets.token_hex(12)
        self._held[lease_id] = _Held(blocks, host, (time.monotonic() if now is None else now) + ttl_s)
        return Lease(lease_id, [b.block_id for b in blocks + host], (len(blocks) + len(host)) * manager.block_size,
                     ttl_s, len(host))

    def release(self, manager: KVCacheManager, lease_id: str) -> int | None:
        """Let the lease's blocks go; how many it held, or None when no such lease is live."""
        held = self._held.pop(lease_id, None)
        if held is None:
            return None
        held.let_go(manager)
        self.released += 1
        return len(held.blocks) + len(held.host_blocks)

    def expire(self, manager: KVCacheManager, now: float | None = None) -> int:
        """End every lease past its TTL (their blocks evictable again); how many ended."""
        now = time.monotonic() if now is None else now
        ended = [lease_id for lease_id, held in self._held.items() if held.expires_at <= now]
        for lease_id in ended:
            self._held.pop(lease_id).let_go(manager)
        self.expired += len(ended)
        return len(ended)

    def held_device_blocks(self) -> list[KVCacheBlock]:
        """Every device block a lease holds, once per lease (integrity checks)."""
        return [b for held in self._held.values() for b in held.blocks]

    def next_expiry_s(self, now: float | None = None) -> float | None:
        """Seconds until the first lease expires (None: no lease)."""
        if not self._held:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, min(h.expires_at for h in self._held.values()) - now)
