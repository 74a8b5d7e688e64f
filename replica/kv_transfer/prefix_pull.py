"""Pulling a prompt's cached prefix from a peer replica into this one's prefix cache.

    holder:  ids = cached_prefix_block_ids(holder_engine.kv_cache_manager, prompt)     # sent to the puller
    puller:  tokens = pull_prefix(engine.kv_cache_manager, agent, peer, prompt, ids)   # then add the request

The puller looks up which leading full blocks it already holds, allocates blocks for the ones after
them that the holder has, reads the holder's blocks into them (``read_blocks``: one READ, waited on
with the agent's timeout), and only then caches them under the prompt's block hashes (BlockStored
goes out; the router learns this replica holds them) and frees them to the evictable pool. The
request added next hits them in the prefix cache like any cached block, so they count in its
``num_cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``), as vLLM counts a connector's
tokens. A failed read frees the blocks uncached: the request computes the prefix itself.

Both replicas must hash alike (the cluster's shared hash seed, same block size) and the blocks must
stay put on the holder while they are read (the holder is idle, or a lease keeps them: not built).
Runs on the engine's thread, between steps; one rank (tensor parallelism pulls per rank: not built).
"""

from __future__ import annotations

import logging

from kvmesh.kvcache.block_pool import KVCacheBlock
from kvmesh.kvcache.hashing import RequestBlockHasher
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.replica.kv_transfer.agent import KVTransferAgent, read_blocks
from kvmesh.replica.kv_transfer.errors import KVTransferError

logger = logging.getLogger(__name__)


def _hasher(manager: KVCacheManager, token_ids: list[int], cache_salt: str | None,
            lora_name: str | None) -> RequestBlockHasher:
    hasher = RequestBlockHasher(manager.block_size, manager.none_hash, cache_salt, lora_name)
    hasher.extend(token_ids)
    return hasher


def _cached_prefix(manager: KVCacheManager, hashes) -> list[KVCacheBlock]:
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
    hasher = _hasher(manager, token_ids, cache_salt, lora_name)
    return [block.block_id for block in _cached_prefix(manager, hasher.block_hashes)]


def pull_prefix(manager: KVCacheManager, agent: KVTransferAgent, peer: str, token_ids: list[int],
                remote_block_ids: list[int], cache_salt: str | None = None, lora_name: str | None = None,
                timeout_s: float | None = None) -> int:
    """Read the blocks of ``token_ids``'s prefix that ``peer`` holds (``remote_block_ids``, its leading full
    blocks in order) and this replica lacks into this replica's prefix cache; the tokens pulled (0 when
    nothing was missing, the pool had no room, or the read failed)."""
    hasher = _hasher(manager, token_ids, cache_salt, lora_name)
    hashes = hasher.block_hashes[: len(remote_block_ids)]
    local = _cached_prefix(manager, hashes)
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
        read_blocks(agent, peer, remote_block_ids[len(local):len(hashes)], [b.block_id for b in new], timeout_s)
    except BaseException as e:
        pool.free_blocks(reversed(local + new))  # never hashed: the garbage in them is never hit
        if not isinstance(e, KVTransferError):
            raise  # the caller's mistake (block ids out of range, an unknown peer): said as it is
        logger.warning("prefix pull of %d blocks from %s failed (%s); the prompt will be computed", wanted, peer, e)
        return 0
    blocks = local + new
    pool.cache_full_blocks(blocks, hashes, len(local), len(blocks), token_ids, hasher.extra_keys, lora_name)
    if manager.offload is not None:  # a host tier keeps a copy, as of any block the device caches
        manager.offload.plan_stores(new)
    pool.free_blocks(reversed(blocks))  # evictable, tail first, like a finished request's
    return wanted * manager.block_size
