"""Leases on the holder: a prompt's cached leading blocks held for a peer to read, until released or expired.

    lease = leases.grant(manager, block_hashes, ttl_s, peer)   # /kv/lease: blocks held (ref count +1)
    lease = leases.lookup(lease_id, block_hashes)              # /kv/lease with a lease_id (a P/D handle): that
                                                               # lease's blocks, only for the chain it holds
    ...                                                        # the peer READs them by id
    leases.release(lease.lease_id)                             # /kv/release: blocks evictable again
    leases.expire()                                            # between steps: leases past their TTL end

A leased block is held in the block pool the way a running request holds it (``touch``: its ref count
rises, it leaves the free queue), so nothing evicts or overwrites it while a peer reads it. Past the
device's own prefix a lease goes on into the host tier (kvcache/offload.py), holding those host blocks
the same way in the tier's pool; the answer says which ids are host ids (``remote_block_media``).

A lease records the block hashes it holds (its chain): block ids go out only for a chain the asker computed
from its own prompt and salt, so no peer reads blocks of another prompt or tenant by naming ids or a lease.
Leases are bounded (``LeaseCaps``: live leases per peer and in all, blocks held): past a cap ``grant``
raises ``LeaseRefused`` (429) and the puller computes the prompt. Everything here runs on the engine thread
(``AsyncLLM``'s commands and its between-step hook), on hashes computed before: never from HTTP.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvmesh.events.schema import DEVICE_MEDIUM, HOST_MEDIUM
from kvmesh.kvcache.block_pool import KVCacheBlock
from kvmesh.kvcache.hashing import BlockHash
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.kv_transfer.prefix_pull import cached_prefix


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


class LeaseRefused(Exception):
    """A lease not granted or not shown: 404 (no such lease), 409 (not this chain's), 429 (a cap reached)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message, self.status = message, status


@dataclass(frozen=True, slots=True)
class LeaseCaps:
    """How much the leases of one replica may hold (KVTransferConfig's ``max_lease*`` fields)."""

    max_per_peer: int = 64
    """Live leases of one peer."""
    max_total: int = 256
    """Live leases of all peers."""
    max_blocks_fraction: float = 0.5
    """Fraction of the device's (and of the host tier's) usable blocks the leases hold together."""

    @classmethod
    def of(cls, config: KVTransferConfig) -> LeaseCaps:
        return cls(config.max_leases_per_peer, config.max_leases, config.max_leased_blocks_fraction)


@dataclass(slots=True)
class _Held:
    blocks: list[KVCacheBlock]
    host_blocks: list[KVCacheBlock]
    expires_at: float
    peer: str
    chain: list[BlockHash]
    """The hashes of ``blocks + host_blocks``: the prompt prefix this lease may be shown for."""

    def let_go(self, manager: KVCacheManager) -> None:
        manager.block_pool.free_blocks(reversed(self.blocks))
        if self.host_blocks:
            manager.offload.host.pool.free_blocks(reversed(self.host_blocks))

    def lease(self, lease_id: str, block_size: int, now: float) -> Lease:
        ids = [b.block_id for b in self.blocks + self.host_blocks]
        return Lease(lease_id, ids, len(ids) * block_size, max(0.0, self.expires_at - now), len(self.host_blocks))


@dataclass(slots=True)
class LeaseTable:
    """The leases of one replica; ``released`` and ``expired`` count how leases ended."""

    caps: LeaseCaps = field(default_factory=LeaseCaps)
    """Set from the replica's KV transfer config before any lease is asked (runtime.py)."""
    released: int = 0
    expired: int = 0
    _held: dict[str, _Held] = field(default_factory=dict)
    _num_blocks: int = 0
    _num_host_blocks: int = 0

    @property
    def active(self) -> int:
        return len(self._held)

    def grant(self, manager: KVCacheManager, block_hashes: Sequence[BlockHash], ttl_s: float, peer: str,
              now: float | None = None) -> Lease:
        """Hold the leading blocks of ``block_hashes`` (a prompt's full blocks' hashes) this replica caches for
        ``ttl_s``: the device tier's, then the host tier's that continue them. ``LeaseRefused`` (429) past a cap."""
        blocks = cached_prefix(manager, block_hashes)
        host = [] if manager.offload is None else manager.offload.lookup(list(block_hashes), len(blocks),
                                                                         len(block_hashes))
        if not blocks and not host:
            return Lease("", [], 0, ttl_s)
        self._check_caps(manager, peer, len(blocks), len(host))
        manager.block_pool.touch(blocks)
        if host:
            manager.offload.host.pool.touch(host)  # not evictable from the tier while leased
        lease_id = secrets.token_hex(16)
        now = time.monotonic() if now is None else now
        held = _Held(blocks, host, now + ttl_s, peer, list(block_hashes[:len(blocks) + len(host)]))
        self._held[lease_id] = held
        self._num_blocks += len(blocks)
        self._num_host_blocks += len(host)
        return held.lease(lease_id, manager.block_size, now)

    def lookup(self, manager: KVCacheManager, lease_id: str, block_hashes: Sequence[BlockHash],
               now: float | None = None) -> Lease:
        """The live lease ``lease_id``, when the chain it holds leads ``block_hashes`` (the asker's prompt and salt,
        hashed); ``LeaseRefused`` otherwise: 404 no such lease, 409 it holds another prompt's blocks."""
        held = self._held.get(lease_id)
        if held is None:
            raise LeaseRefused(f"lease {lease_id!r} is unknown, already released or expired", 404)
        if list(block_hashes[:len(held.chain)]) != held.chain:
            raise LeaseRefused(f"lease {lease_id!r} does not hold this prompt's blocks (prompt_token_ids and "
                               "cache_salt must be the ones it was taken for)", 409)
        return held.lease(lease_id, manager.block_size, time.monotonic() if now is None else now)

    def _check_caps(self, manager: KVCacheManager, peer: str, num_blocks: int, num_host_blocks: int) -> None:
        caps = self.caps
        if len(self._held) >= caps.max_total:
            raise LeaseRefused(f"this replica holds {len(self._held)} leases, its cap (kv_transfer.max_leases); "
                               "compute the prompt or retry once leases end", 429)
        of_peer = sum(1 for held in self._held.values() if held.peer == peer)
        if of_peer >= caps.max_per_peer:
            raise LeaseRefused(f"peer {peer!r} holds {of_peer} leases here, its cap (kv_transfer.max_leases_per_"
                               "peer); release leases after reading them", 429)
        limit = int(caps.max_blocks_fraction * (manager.block_pool.num_blocks - 1))
        host_limit = 0 if manager.offload is None else int(caps.max_blocks_fraction * manager.offload.host.num_blocks)
        if self._num_blocks + num_blocks > limit or self._num_host_blocks + num_host_blocks > host_limit:
            raise LeaseRefused(f"leasing {num_blocks} more blocks would hold more than {caps.max_blocks_fraction:g} "
                               "of this replica's KV blocks (kv_transfer.max_leased_blocks_fraction); "
                               "compute the prompt", 429)

    def release(self, manager: KVCacheManager, lease_id: str) -> int | None:
        """Let the lease's blocks go; how many it held, or None when no such lease is live."""
        held = self._held.pop(lease_id, None)
        if held is None:
            return None
        self._let_go(manager, held)
        self.released += 1
        return len(held.blocks) + len(held.host_blocks)

    def expire(self, manager: KVCacheManager, now: float | None = None) -> int:
        """End every lease past its TTL (their blocks evictable again); how many ended."""
        now = time.monotonic() if now is None else now
        ended = [lease_id for lease_id, held in self._held.items() if held.expires_at <= now]
        for lease_id in ended:
            self._let_go(manager, self._held.pop(lease_id))
        self.expired += len(ended)
        return len(ended)

    def _let_go(self, manager: KVCacheManager, held: _Held) -> None:
        held.let_go(manager)
        self._num_blocks -= len(held.blocks)
        self._num_host_blocks -= len(held.host_blocks)

    def held_device_blocks(self) -> list[KVCacheBlock]:
        """Every device block a lease holds, once per lease (integrity checks)."""
        return [b for held in self._held.values() for b in held.blocks]

    def next_expiry_s(self, now: float | None = None) -> float | None:
        """Seconds until the first lease expires (None: no lease)."""
        if not self._held:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, min(h.expires_at for h in self._held.values()) - now)
