"""What a replica's ``BlockStored`` and ``BlockRemoved`` events do to its entry in the prefix index (``PrefixIndex``'s
part, router/routing/index.py): a stored chain keyed from its parent (or parked until the parent comes, orphans.py)
and its bits set, a predicted bit confirmed; a removed block's bit cleared unless another of the replica's external
hashes still maps to its key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import and_, or_

from kvmesh.events.schema import BlockStored
from kvmesh.router.routing.index_stats import IndexStats, ReplicaBlocks
from kvmesh.router.routing.keys import RouterKeyHasher, pack_tokens
from kvmesh.router.routing.orphans import adopt_orphans, drop_orphan, park_orphans
from kvmesh.router.routing.predictions import Predictions


class BlockEvents:
    """``PrefixIndex``'s block events."""

    block_size: int
    hasher: RouterKeyHasher
    stats: IndexStats
    predictions: Predictions
    _blocks: dict[int, int]

    def _store(self, tree: ReplicaBlocks, event: BlockStored) -> None:
        hashes = event.block_hashes
        n = len(hashes)
        if event.block_size != self.block_size or len(event.token_ids) != n * self.block_size:
            self.stats.bad_block_size += n
            return
        ext_to_key = tree.ext_to_key
        parent = event.parent_block_hash
        extra = event.extra_keys
        if extra is None and event.lora_name is not None:
            from kvmesh.kvcache.hashing import block_extra_keys

            extra = [block_extra_keys(1, None, event.lora_name)] * n
        parent_key = self.hasher.seed if parent is None else ext_to_key.get(parent)
        try:
            if parent_key is None:  # parent evicted or its event missed: key the chain once it comes (orphans.py)
                park_orphans(tree, parent, hashes, pack_tokens(event.token_ids), extra, self.block_size)
                self.stats.orphan_blocks += n
                return
            keys = self.hasher.chain(event.token_ids, n, parent_key, extra)
        except (ValueError, TypeError):  # a token id outside [0, 2**32): not from a real tokenizer
            self.stats.bad_events += 1
            return
        self._insert(tree, hashes, keys)
        self.stats.blocks_stored += n
        if tree.orphans:
            adopt_orphans(tree, hashes, self.hasher, self._insert)

    def _insert(self, tree: ReplicaBlocks, hashes: Sequence, keys: list[int]) -> None:
        ext_to_key = tree.ext_to_key
        blocks, predicted = self._blocks, self.predictions.predicted
        bit = tree.bit
        if ext_to_key.keys().isdisjoint(hashes):  # the usual case, done with C-level bulk updates
            masks = list(map(blocks.get, keys, repeat(0)))
            if not any(map(and_, masks, repeat(bit))):
                ext_to_key.update(zip(hashes, keys, strict=False))
                blocks.update(zip(keys, map(or_, masks, repeat(bit)), strict=False))
                return
        for ext, key in zip(hashes, keys, strict=False):
            if ext in ext_to_key:
                tree.ext_dups[ext] = tree.ext_dups.get(ext, 0) + 1
                continue
            ext_to_key[ext] = key
            mask = blocks.get(key, 0)
            if not mask & bit:
                blocks[key] = mask | bit
            elif predicted and predicted.get(key, 0) & bit:
                self.predictions.confirm(key, bit)
            else:  # another external hash of this replica already maps to the key
                tree.key_dups[key] = tree.key_dups.get(key, 0) + 1

    def _remove(self, tree: ReplicaBlocks, hashes: Iterable) -> None:
        ext_to_key, blocks = tree.ext_to_key, self._blocks
        mask_off = ~tree.bit
        for ext in hashes:
            key = ext_to_key.get(ext)
            if key is None:
                if ext in tree.orphan_parent:
                    self.stats.blocks_removed += 1
                    drop_orphan(tree, ext)
                else:
                    self.stats.unknown_removals += 1
                continue
            self.stats.blocks_removed += 1
            if tree.ext_dups and ext in tree.ext_dups:
                tree.ext_dups[ext] -= 1
                if not tree.ext_dups[ext]:
                    del tree.ext_dups[ext]
                continue
            del ext_to_key[ext]
            if tree.key_dups and key in tree.key_dups:
                tree.key_dups[key] -= 1
                if not tree.key_dups[key]:
                    del tree.key_dups[key]
                continue
            mask = blocks.get(key, 0) & mask_off
            if mask:
                blocks[key] = mask
            else:
                blocks.pop(key, None)
