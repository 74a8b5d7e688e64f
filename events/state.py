"""The set of cached blocks that an event stream describes, and its snapshot as BlockStored chains.

``CachedBlockSet`` folds events: ``BlockStored`` adds blocks, ``BlockRemoved`` removes them,
``AllBlocksCleared`` empties the set. The publisher keeps one as its *shadow* of the replica's
cache (built from the very batches it sends, so it is consistent with the last sent seq by
construction), and answers snapshot requests from it; tests and ``kvmesh events tail`` use it to
check that a subscriber converged.

A block is keyed by ``(medium, hash)``: vLLM may announce the same hash on two media (GPU and
a CPU offload tier), and each is stored and removed on its own. Each entry keeps a reference to
the event that stored it plus its index in that event, so no token ids are copied.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

BlockKey = tuple  # (medium, external hash)

# BlockStored fields that must agree for two blocks to share one snapshot event.
_META_FIELDS = tuple(
    f
    for f in BlockStored.__struct_fields__
    if f not in ("block_hashes", "parent_block_hash", "token_ids", "extra_keys")
)


class CachedBlockSet:
    """The cached blocks described by a stream of KV events."""

    def __init__(self) -> None:
        # (medium, hash) -> (event that stored it, index of the block in that event)
        self._blocks: dict[BlockKey, tuple[BlockStored, int]] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._blocks

    def keys(self) -> set[BlockKey]:
        """Every cached block as ``(medium, hash)``."""
        return set(self._blocks)

    def hashes(self) -> set[int]:
        """Every cached block's hash (all media together)."""
        return {h for _, h in self._blocks}

    def clear(self) -> None:
        self._blocks.clear()

    def apply(self, event: KVEvent) -> None:
        """Fold one event into the set."""
        blocks = self._blocks
        cls = event.__class__
        if cls is BlockStored:
            medium = event.medium
            for i, h in enumerate(event.block_hashes):
                blocks[(medium, h)] = (event, i)
        elif cls is BlockRemoved:
            medium = event.medium
            for h in event.block_hashes:
                blocks.pop((medium, h), None)
        elif cls is AllBlocksCleared:
            blocks.clear()

    def apply_all(self, events: Iterable[KVEvent]) -> None:
        for event in events:
            self.apply(event)

    def parent_of(self, key: BlockKey):
        """The parent hash recorded for a cached block (None at a chain's root)."""
        event, i = self._blocks[key]
        return event.parent_block_hash if i == 0 else event.block_hashes[i - 1]

    def _ordered(self) -> Iterator[BlockKey]:
        """Every key, each parent that is itself cached before its children."""
        blocks = self._blocks
        done: set[BlockKey] = set()
        for key in blocks:
            if key in done:
                continue
            # Walk up to the oldest not-yet-emitted cached ancestor, then emit downwards.
            path = [key]
            on_path = {key}  # guards against a cycle (only possible with a hash collision)
            medium = key[0]
            while True:
                parent = self.parent_of(path[-1])
                pkey = (medium, parent)
                if parent is None or pkey not in blocks or pkey in done or pkey in on_path:
                    break
                path.append(pkey)
                on_path.add(pkey)
            for k in reversed(path):
                done.add(k)
                yield k

    def snapshot(self, max_blocks_per_event: int = 4096) -> list[BlockStored]:
        """The whole set as BlockStored chains, parents before children.

        Consecutive blocks become one event when each is the child of the previous one and
        they share every per-event field (block size, lora, medium, group, spec). Applying the
        result to an empty set reproduces this set exactly (``keys()``, parents included).
        """
        out: list[BlockStored] = []
        cur: BlockStored | None = None
        cur_meta: tuple = ()
        cur_extra: list = []
        meta_cache: dict[int, tuple] = {}
        for key in self._ordered():
            event, i = self._blocks[key]
            meta = meta_cache.get(id(event))
            if meta is None:
                meta = meta_cache[id(event)] = tuple(getattr(event, f) for f in _META_FIELDS)
            parent = event.parent_block_hash if i == 0 else event.block_hashes[i - 1]
            bs = event.block_size
            tokens = event.token_ids[i * bs : (i + 1) * bs]
            extra = event.extra_keys[i] if event.extra_keys is not None and i < len(event.extra_keys) else None
            if (
                cur is not None
                and meta == cur_meta
                and parent == cur.block_hashes[-1]
                and len(cur.block_hashes) < max_blocks_per_event
            ):
                cur.block_hashes.append(key[1])
                cur.token_ids.extend(tokens)
                cur_extra.append(extra)
                continue
            if cur is not None:
                cur.extra_keys = cur_extra if any(e is not None for e in cur_extra) else None
            cur = BlockStored(
                block_hashes=[key[1]],
                parent_block_hash=parent,
                token_ids=list(tokens),
                **dict(zip(_META_FIELDS, meta, strict=True)),
            )
            cur_meta, cur_extra = meta, [extra]
            out.append(cur)
        if cur is not None:
            cur.extra_keys = cur_extra if any(e is not None for e in cur_extra) else None
        return out
