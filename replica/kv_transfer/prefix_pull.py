"""Pulling a prompt's cached prefix from a peer replica into this one's prefix cache.

    holder:  ids = cached_prefix_block_ids(holder_engine.kv_cache_manager, prompt)     # sent to the puller
    puller:  pending = start_pull(engine.kv_cache_manager, agent, peer, prompt, ids)   # between two steps
             tokens = pending.poll()          # between later steps: None while in flight; then add the request

The puller looks up which leading full blocks it already holds, allocates blocks for the ones after
them that the holder has, starts reading the holder's blocks into them (one READ per holder tier: its
device cache, then the host tier for blocks it keeps only in host memory, ``remote_block_media``;
``PendingPull.poll`` checks them without waiting, up to the agent's timeout), and only then caches them
under the prompt's block hashes (BlockStored
goes out; the router learns this replica holds them) and frees them to the evictable pool. The
request added next hits them in the prefix cache like any cached block, so they count in its
``num_cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``), as vLLM counts a connector's
tokens. A failed read frees the blocks uncached: the request computes the prefix itself.

Both replicas must hash alike (the cluster's shared hash seed, same block size) and the blocks must
stay put on the holder while they are read (a lease keeps them: leases.py). Runs on the engine's thread,
between steps; under tensor parallelism the agent reads on every rank (tp_agent.py).
"""

from __future__ import annotations

import logging
import time

from kvmesh.events.schema import DEVICE_MEDIUM
from kvmesh.kvcache.block_pool import KVCacheBlock
from kvmesh.kvcache.hashing import RequestBlockHasher
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.replica.kv_transfer.agent import KVTransfer, KVTransferAgent
from kvmesh.replica.kv_transfer.errors import KVTransferError, KVTransferTimeout

logger = logging.getLogger(__name__)


def block_hasher(manager: KVCacheManager, token_ids: list[int], cache_salt: str | None,
            lora_name: str | None) -> RequestBlockHasher:
    hasher = RequestBlockHasher(manager.block_size, manager.none_hash, cache_salt, lora_name)
    hasher.extend(token_ids)
    return hasher


def cached_prefix(manager: KVCacheManager, hashes) -> list[KVCacheBlock]:
    """The leading blocks of ``hashes`` this manager holds, up to the first it does not."""
    get, blocks = manager.block_pool.cached_block_hash_to_block.get, []
    for h in hashes:
        block = get(h)
        if block is None:
            break
        blocks.append(block)
    return blocks


def cached_prefix_block_ids(manager: KVCacheManager, token_ids: list[int], cache_salt: str | None = None,
                            lora_name: str | None = None) -> list[int]:
    """Block ids of the leading full blocks of ``token_ids`` that this replica holds (the holder's answer)."""
    hasher = block_hasher(manager, token_ids, cache_salt, lora_name)
    return [block.block_id for block in cached_prefix(manager, hasher.block_hashes)]


class PendingPull:
    """A started prefix pull: its blocks are held (not evictable, not hashed) until ``poll`` sees the read end.

    Lives on the engine thread: ``start_pull`` makes it between two steps, ``poll`` checks it between the
    next ones without waiting (vLLM's WAITING_FOR_REMOTE_KVS), so the read overlaps other requests' steps.
    """

    def __init__(self, manager: KVCacheManager, transfer: KVTransfer, peer: str, token_ids: list[int],
                 hasher: RequestBlockHasher, local: list[KVCacheBlock], new: list[KVCacheBlock],
                 lora_name: str | None, deadline: float) -> None:
        self.manager, self.transfer, self.peer, self.token_ids = manager, transfer, peer, token_ids
        self.hasher, self.local, self.new, self.lora_name, self.deadline = hasher, local, new, lora_name, deadline
        self.num_tokens = len(new) * manager.block_size
        """Tokens this pull brings once it is done."""

    def poll(self, now: float | None = None) -> int | None:
        """None while the read is in flight; else the tokens pulled, now cached. A failed or timed-out read
        frees the blocks uncached and raises ``KVTransferError`` (the prompt will be computed)."""
        state = self.transfer.state()
        if state == "PROC" and (now if now is not None else time.monotonic()) <= self.deadline:
            return None
        self.transfer.release()
        if state != "DONE":
            self.fail()
            why = "did not finish in time (peer dead or stalled)" if state == "PROC" else f"ended in state {state}"
            raise (KVTransferTimeout if state == "PROC" else KVTransferError)(
                f"reading {len(self.new)} KV blocks from {self.peer!r} {why}; recompute them")
        blocks, pool = self.local + self.new, self.manager.block_pool
        hashes = self.hasher.block_hashes[: len(blocks)]
        pool.cache_full_blocks(blocks, hashes, len(self.local), len(blocks), self.token_ids, self.hasher.extra_keys,
                               self.lora_name)
        if self.manager.offload is not None:  # a host tier keeps a copy, as of any block the device caches
            self.manager.offload.plan_stores(self.new)
        pool.free_blocks(reversed(blocks))  # evictable, tail first, like a finished request's
        return self.num_tokens

    def fail(self) -> None:
        """Free the blocks unhashed (the garbage in them is never hit)."""
        self.manager.block_pool.free_blocks(reversed(self.local + self.new))


class TierReads:
    """The reads of one pull, one per tier of the holder it reads from: DONE when all are, ERR when one is."""

    def __init__(self, transfers: list[KVTransfer], num_blocks: int) -> None:
        self.transfers, self.num_blocks = transfers, num_blocks

    def state(self) -> str:
        states = [t.state() for t in self.transfers]
        return "ERR" if "ERR" in states else "PROC" if "PROC" in states else "DONE"

    def release(self) -> None:
        for t in self.transfers:
            t.release()


def _start_reads(agent: KVTransferAgent, peer: str, remote_ids: list[int], media: list[str],
                 local_ids: list[int]) -> TierReads:
    """One read per run of ``media`` (the holder's device blocks, then its host tier's)."""
    reads: list[KVTransfer] = []
    try:
        start = 0
        while start < len(remote_ids):
            end = start
            while end < len(remote_ids) and media[end] == media[start]:
                end += 1
            reads.append(agent.start_read(peer, remote_ids[start:end], local_ids[start:end], media[start]))
            start = end
    except BaseException:
        for read in reads:
            read.release()
        raise
    return TierReads(reads, len(local_ids))


def start_pull(manager: KVCacheManager, agent: KVTransferAgent, peer: str, token_ids: list[int],
               remote_block_ids: list[int], cache_salt: str | None = None, lora_name: str | None = None,
               timeout_s: float | None = None, remote_block_media: list[str] | None = None) -> PendingPull | int:
    """Allocate the blocks of ``token_ids``'s prefix that ``peer`` holds (``remote_block_ids``, its leading full
    blocks in order; ``remote_block_media`` the tier of each, ``"GPU"`` when None) and this replica lacks, and
    start reading them; the pull in flight, or 0 when nothing was missing or the pool had no room. A read that
    cannot start raises (``KVTransferError``: a dead peer; a ``ValueError``: bad block ids), its blocks freed."""
    media = remote_block_media or [DEVICE_MEDIUM] * len(remote_block_ids)
    if len(media) != len(remote_block_ids):
        raise ValueError(f"{len(media)} block media for {len(remote_block_ids)} remote block ids; give one per id")
    hasher = block_hasher(manager, token_ids, cache_salt, lora_name)
    hashes = hasher.block_hashes[: len(remote_block_ids)]
    local = cached_prefix(manager, hashes)
    wanted = len(hashes) - len(local)
    pool = manager.block_pool
    if wanted <= 0:
        return 0
    pool.touch(local)  # held, so allocating below cannot evict the chain the new blocks extend
    if wanted > pool.get_num_free_blocks():
        pool.free_blocks(reversed(local))
        logger.info("prefix pull from %s skipped: %d blocks wanted, %d free", peer, wanted,
                    pool.get_num_free_blocks())
        return 0
    new = pool.get_new_blocks(wanted)
    try:
        transfer = _start_reads(agent, peer, remote_block_ids[len(local):len(hashes)], media[len(local):len(hashes)],
                                [b.block_id for b in new])
    except BaseException:
        pool.free_blocks(reversed(local + new))  # never hashed
        raise
    timeout_s = agent.config.timeout_s if timeout_s is None else timeout_s
    return PendingPull(manager, transfer, peer, token_ids, hasher, local, new, lora_name,
                       time.monotonic() + timeout_s)


def pull_prefix(manager: KVCacheManager, agent: KVTransferAgent, peer: str, token_ids: list[int],
                remote_block_ids: list[int], cache_salt: str | None = None, lora_name: str | None = None,
                timeout_s: float | None = None, remote_block_media: list[str] | None = None) -> int:
    """``start_pull`` and wait for it here (tools and tests; a serving engine polls between steps instead);
    the tokens pulled (0 when nothing was missing, the pool had no room, or the read failed)."""
    try:
        pending = start_pull(manager, agent, peer, token_ids, remote_block_ids, cache_salt, lora_name, timeout_s,
                             remote_block_media)
        while not isinstance(pending, int):
            if (done := pending.poll()) is not None:
                return done
            time.sleep(agent.config.poll_interval_s)
    except KVTransferError as e:
        logger.warning("prefix pull from %s failed (%s); the prompt will be computed", peer, e)
        return 0
    return pending
