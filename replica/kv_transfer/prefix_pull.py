"""Pulling a prompt's cached prefix from a peer replica into this one's prefix cache.

    holder:  ids = cached_prefix_block_ids(holder_engine.kv_cache_manager, prompt)     # sent to the puller
    puller:  pending = start_pull(engine.kv_cache_manager, agent, peer, prompt, ids)   # between two steps
             tokens = pending.poll()          # between later steps: None while in flight; then add the request

The puller looks up which leading full blocks it already holds, allocates blocks for the ones after
them that the holder has, has the agent's transfer worker thread read the holder's blocks into them (one
READ per holder tier: its device cache, then the host tier for blocks it keeps only in host memory,
``remote_block_media``; pull_read.py), lets ``PendingPull.poll`` check the worker's flags without waiting, up
to the agent's timeout, and only then caches them
under the prompt's block hashes (BlockStored
goes out; the router learns this replica holds them) and frees them to the evictable pool. The
request added next hits them in the prefix cache like any cached block, so they count in its
``num_cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``), as vLLM counts a connector's
tokens. A failed read's blocks are freed uncached, but only once the transport confirms nothing more lands in
them (until then they are quarantined: held, never reused); the request computes the prefix itself.

Both replicas must hash alike (the cluster's shared hash seed, same block size) and the blocks must
stay put on the holder while they are read (a lease keeps them: leases.py). The pool's side runs on the
engine's thread, between steps, the reads on the worker; under tensor parallelism the agent reads on every
rank (tp_agent.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvmesh.events.schema import DEVICE_MEDIUM
from kvmesh.kvcache.block_pool import KVCacheBlock
from kvmesh.kvcache.hashing import RequestBlockHasher
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.replica.kv_transfer.agent import KVTransferAgent
from kvmesh.replica.kv_transfer.errors import KVTransferError, KVTransferTimeout
from kvmesh.replica.kv_transfer.pull_read import PullRead, read_worker, wait_over

logger = logging.getLogger(__name__)


def block_hasher(manager: KVCacheManager, token_ids: list[int], cache_salt: str | None,
            lora_name: str | None, lora_identity: str | None = None) -> RequestBlockHasher:
    """The prompt's hashes as ``manager`` keys them (``lora_identity``: the adapter's weights, after its name)."""
    hasher = RequestBlockHasher(manager.block_size, manager.none_hash, cache_salt, lora_name, lora_identity)
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
                            lora_name: str | None = None, lora_identity: str | None = None) -> list[int]:
    """Block ids of the leading full blocks of ``token_ids`` that this replica holds (the holder's answer)."""
    hasher = block_hasher(manager, token_ids, cache_salt, lora_name, lora_identity)
    return [block.block_id for block in cached_prefix(manager, hasher.block_hashes)]


class PendingPull:
    """A started prefix pull: its blocks are held (not evictable, not hashed) until its read is over.

    Lives on the engine thread: ``start_pull`` makes it between two steps and hands the read to the agent's
    transfer worker (pull_read.py); ``poll`` reads the worker's flags between the next ones without waiting
    (vLLM's WAITING_FOR_REMOTE_KVS), so the read overlaps other requests' steps.
    """

    def __init__(self, manager: KVCacheManager, read: PullRead, token_ids: list[int], hasher: RequestBlockHasher,
                 local: list[KVCacheBlock], new: list[KVCacheBlock], lora_name: str | None, deadline: float) -> None:
        self.manager, self.read, self.token_ids, self.hasher = manager, read, token_ids, hasher
        self.local, self.new, self.lora_name, self.deadline = local, new, lora_name, deadline
        self.num_tokens = len(new) * manager.block_size
        """Tokens this pull brings once it is done."""

    def poll(self, now: float | None = None) -> int | None:
        """None while the read is in flight; else the tokens pulled, now cached. A failed or timed-out read raises
        ``KVTransferError`` (the prompt will be computed): its held prefix is let go, and its new blocks are
        quarantined (``quarantined``) until the transport confirms the read is over (``settle``)."""
        outcome = self.read.outcome
        if outcome is None:
            if (now if now is not None else time.monotonic()) <= self.deadline:
                return None
            outcome = self.read.give_up(KVTransferTimeout(
                f"reading {len(self.new)} KV blocks from {self.read.peer!r} did not finish in time (peer dead or "
                "stalled); recompute them"))
        if outcome != "DONE":
            self.manager.block_pool.free_blocks(reversed(self.local))  # cached already: the read never writes them
            self.local = []
            raise outcome
        blocks, pool = self.local + self.new, self.manager.block_pool
        hashes = self.hasher.block_hashes[: len(blocks)]
        pool.cache_full_blocks(blocks, hashes, len(self.local), len(blocks), self.token_ids, self.hasher.extra_keys,
                               self.lora_name)
        if self.manager.offload is not None:  # a host tier keeps a copy, as of any block the device caches
            self.manager.offload.plan_stores(self.new)
        pool.free_blocks(reversed(blocks))  # evictable, tail first, like a finished request's
        return self.num_tokens

    @property
    def quarantined(self) -> bool:
        """Failed, its new blocks still held because the transport may still write into them."""
        return self.read.outcome is not None and self.read.outcome != "DONE" and not self.read.over

    def settle(self) -> bool:
        """A failed pull: free its blocks unhashed (the garbage in them is never hit) once its read is over; True
        when freed."""
        if not self.read.over:
            return False
        self.manager.block_pool.free_blocks(reversed(self.local + self.new))
        self.local, self.new = [], []
        return True


def start_pull(manager: KVCacheManager, agent: KVTransferAgent, peer: str, token_ids: list[int],
               remote_block_ids: list[int], cache_salt: str | None = None, lora_name: str | None = None,
               timeout_s: float | None = None, remote_block_media: list[str] | None = None,
               on_progress: Callable[[], None] | None = None, lora_identity: str | None = None) -> PendingPull | int:
    """Allocate the blocks of ``token_ids``'s prefix that ``peer`` holds (``remote_block_ids``, its leading full
    blocks in order; ``remote_block_media`` the tier of each, ``"GPU"`` when None) and this replica lacks, and
    hand their read to the agent's transfer worker (``on_progress`` is called from there when it moves on); the
    pull in flight, or 0 when nothing was missing or the pool had no room. A read that cannot start (a dead peer,
    bad block ids) fails the pull at its first ``poll``."""
    media = remote_block_media or [DEVICE_MEDIUM] * len(remote_block_ids)
    if len(media) != len(remote_block_ids):
        raise ValueError(f"{len(media)} block media for {len(remote_block_ids)} remote block ids; give one per id")
    hasher = block_hasher(manager, token_ids, cache_salt, lora_name, lora_identity)
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
    read = PullRead(agent, peer, remote_block_ids[len(local):len(hashes)], media[len(local):len(hashes)],
                    [b.block_id for b in new])
    read_worker(agent).submit(read, on_progress)
    timeout_s = agent.config.timeout_s if timeout_s is None else timeout_s
    return PendingPull(manager, read, token_ids, hasher, local, new, lora_name, time.monotonic() + timeout_s)


def pull_prefix(manager: KVCacheManager, agent: KVTransferAgent, peer: str, token_ids: list[int],
                remote_block_ids: list[int], cache_salt: str | None = None, lora_name: str | None = None,
                timeout_s: float | None = None, remote_block_media: list[str] | None = None,
                lora_identity: str | None = None) -> int:
    """``start_pull`` and wait for it here (tools and tests; a serving engine polls between steps instead);
    the tokens pulled (0 when nothing was missing, the pool had no room, or the read failed). A failed read's
    blocks are freed once the transport confirms it is over, waited for up to the timeout again; past that
    they stay held (leaked: never reused while the transport may still write them)."""
    pending = start_pull(manager, agent, peer, token_ids, remote_block_ids, cache_salt, lora_name, timeout_s,
                         remote_block_media, lora_identity=lora_identity)
    try:
        while not isinstance(pending, int):
            if (done := pending.poll()) is not None:
                return done
            time.sleep(agent.config.poll_interval_s)
    except KVTransferError as e:
        logger.warning("prefix pull from %s failed (%s); the prompt will be computed", peer, e)
    except ValueError:
        wait_over(pending.read, agent.config.timeout_s)
        pending.settle()
        raise
    else:
        return pending
    if not (wait_over(pending.read, agent.config.timeout_s) and pending.settle()):
        logger.error("prefix pull from %s: the transport never confirmed the failed read is over; its %d blocks "
                     "stay held", peer, len(pending.new))
    return 0
