"""The pool's cached set as BlockStored chains, parents before children (the events snapshot source).

Each cached block remembers the hash of the block before it in the request that cached it. A block
whose parent is still cached hangs below it; one whose parent was evicted starts a chain of its
own whose ``parent_block_hash`` is that recorded parent, exactly as its original event said::

    cached:   A -> B -> C        D (parent X, evicted) -> E
                   `-> F
    chains:   [A, B, C]  [F] (parent B)  [D, E] (parent X)
"""

from __future__ import annotations

from kvmesh.events.schema import BlockStored
from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.hashing import BlockHash, external_hash


def block_stored_event(chain: list[KVCacheBlock], block_size: int, medium: str | None) -> BlockStored:
    """One BlockStored for consecutive cached blocks ``chain`` (parent first)."""
    parent = chain[0].parent_block_hash
    token_ids: list[int] = []
    for block in chain:
        token_ids += block.token_ids
    extra_keys = [block.extra_keys for block in chain]
    return BlockStored(
        block_hashes=[external_hash(block.block_hash) for block in chain],
        parent_block_hash=None if parent is None else external_hash(parent),
        token_ids=token_ids,
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=chain[0].lora_name,
        extra_keys=extra_keys if any(k is not None for k in extra_keys) else None,
    )


def snapshot_chains(cached: dict[BlockHash, KVCacheBlock]) -> list[list[KVCacheBlock]]:
    """Every cached block exactly once, grouped into parent-first chains (see the module doc).

    ``cached`` must be a copy of the pool's map: stale entries are dropped from it.
    """
    children: dict[BlockHash, list[KVCacheBlock]] = {}
    roots: list[KVCacheBlock] = []
    for h, block in list(cached.items()):
        if block.block_hash != h or block.token_ids is None:  # evicted meanwhile (concurrent caller)
            del cached[h]
            continue
        parent = block.parent_block_hash
        if parent is not None and parent in cached:
            children.setdefault(parent, []).append(block)
        else:
            roots.append(block)
    chains: list[list[KVCacheBlock]] = []
    stack = roots[::-1]
    while stack:
        start = stack.pop()
        chain = [start]
        block = start
        while kids := children.get(block.block_hash):
            nxt = kids[0]
            stack.extend(reversed(kids[1:]))  # siblings start their own chains later
            if nxt.lora_name != start.lora_name:
                stack.append(nxt)
                break
            chain.append(nxt)
            block = nxt
        chains.append(chain)
    return chains


def snapshot_events(cached: dict[BlockHash, KVCacheBlock], block_size: int,
                    medium: str | None) -> list[BlockStored]:
    """The cached set as BlockStored events; replaying them rebuilds it exactly."""
    return [block_stored_event(chain, block_size, medium) for chain in snapshot_chains(cached)]
