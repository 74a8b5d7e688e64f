"""The set of cached blocks that an event stream describes, and its snapshot as BlockStored chains.

``CachedBlockSet`` folds events: ``BlockStored`` adds blocks, ``BlockRemoved`` removes them,
``AllBlocksCleared`` empties the set. The publisher keeps one as its *shadow* of the replica's
cache (built from the very batches it sends, so it is consistent with the last sent seq by
construction), and answers snapshot requests from it; tests and ``kvmesh events tail`` use it to
check that a subscriber converged.

A block is keyed by ``(medium, hash)``: vLLM may announce the same hash on two media (GPU and
a CPU offload tier), and each is stored and removed on its own. Each entry keeps a reference to
the event that stored it plus its index in that event, so no token ids are copied; a snapshot
slices whole runs of one event at a time, so it costs little more than one pass over the set.
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
        # medium -> hash -> (event that stored it, index of the block in it, order of that event).
        # Dict order = store order (a re-stored hash is moved to the end), which snapshot() uses.
        self._media: dict[str | None, dict[int, tuple[BlockStored, int, int]]] = {}
        self._order = 0

    def __len__(self) -> int:
        return sum(len(d) for d in self._media.values())

    def __contains__(self, key: BlockKey) -> bool:
        d = self._media.get(key[0])
        return d is not None and key[1] in d

    def keys(self) -> set[BlockKey]:
        """Every cached block as ``(medium, hash)``."""
        return {(m, h) for m, d in self._media.items() for h in d}

    def hashes(self) -> set[int]:
        """Every cached block's hash (all media together)."""
        return {h for d in self._media.values() for h in d}

    def clear(self) -> None:
        self._media.clear()

    def apply(self, event: KVEvent) -> None:
        """Fold one event into the set."""
        self.apply_all((event,))

    def apply_all(self, events: Iterable[KVEvent]) -> None:
        """Fold events into the set, in order (the publisher's hot path: kept in one loop)."""
        media = self._media
        order = self._order
        last_medium, blocks = object(), None  # cache the medium's dict across events
        for event in events:
            if isinstance(event, BlockStored):
                if event.medium is not last_medium:
                    last_medium = event.medium
                    blocks = media.setdefault(last_medium, {})
                order += 1
                hashes = event.block_hashes
                if len(hashes) == 1:
                    h = hashes[0]
                    if h in blocks:
                        del blocks[h]
                    blocks[h] = (event, 0, order)
                    continue
                for i, h in enumerate(hashes):
                    if h in blocks:
                        del blocks[h]
                    blocks[h] = (event, i, order)
            elif isinstance(event, BlockRemoved):
                if event.medium is not last_medium:
                    last_medium = event.medium
                    blocks = media.setdefault(last_medium, {})
                pop = blocks.pop
                for h in event.block_hashes:
                    pop(h, None)
            elif isinstance(event, AllBlocksCleared):
                media.clear()
                last_medium, blocks = object(), None
        self._order = order

    def snapshot(self, max_blocks_per_event: int = 4096) -> list[BlockStored]:
        """The whole set as BlockStored chains, parents before children.

        Consecutive blocks become one event when each is the child of the previous one and
        they share every per-event field (block size, lora, medium, group, spec). Applying the
        result to an empty set reproduces this set exactly (``keys()``, parents included).
        """
        return list(self.iter_snapshot(max_blocks_per_event))

    def iter_snapshot(self, max_blocks_per_event: int = 4096) -> Iterator[BlockStored]:
        """``snapshot()`` as a generator, so a sender can stream chunks while it builds them.
        The set must not change while the generator runs."""
        for blocks in list(self._media.values()):
            yield from _chains(blocks, _parent_first_runs(blocks), max_blocks_per_event)


def _parent_first_runs(blocks: dict) -> list[list]:
    """The cached blocks as runs ``[event, first index, end index]`` (lists: a run's end grows in place), parents
    before children.

    Store order already puts parents first, except where a parent was evicted and stored again
    after its child; only then do we sort topologically (rare, and slower).
    """
    runs: list[list] = []
    cur_event, cur_end = None, -1
    get = blocks.get
    in_order = True
    for event, i, order in blocks.values():
        if event is cur_event and i == cur_end:
            runs[-1][2] = cur_end = i + 1
            continue
        parent = event.parent_block_hash if i == 0 else event.block_hashes[i - 1]
        entry = get(parent) if parent is not None else None
        if entry is not None and (entry[2], entry[1]) > (order, i):
            in_order = False
            break
        runs.append([event, i, i + 1])
        cur_event, cur_end = event, i + 1
    if in_order:
        return runs
    return [[event, i, i + 1] for event, i in _topological(blocks)]


def _topological(blocks: dict) -> Iterator[tuple[BlockStored, int]]:
    done: set[int] = set()
    for h in blocks:
        if h in done:
            continue
        path, on_path = [h], {h}  # on_path guards against a cycle (only with a hash collision)
        while True:
            event, i, _ = blocks[path[-1]]
            parent = event.parent_block_hash if i == 0 else event.block_hashes[i - 1]
            if parent is None or parent not in blocks or parent in done or parent in on_path:
                break
            path.append(parent)
            on_path.add(parent)
        for k in reversed(path):
            done.add(k)
            event, i, _ = blocks[k]
            yield event, i


def _chains(blocks: dict, runs, max_blocks: int) -> Iterator[BlockStored]:
    """Merge runs into BlockStored events: a run joins the previous one when it continues its
    chain and shares its per-event fields."""
    cur: BlockStored | None = None
    cur_meta: tuple = ()
    extras: list = []
    meta_of: dict[int, tuple] = {}
    for event, i, j in runs:
        meta = meta_of.get(id(event))
        if meta is None:
            meta = meta_of[id(event)] = tuple(getattr(event, f) for f in _META_FIELDS)
        parent = event.parent_block_hash if i == 0 else event.block_hashes[i - 1]
        bs = event.block_size
        ek = event.extra_keys
        run_extra = list(ek[i:j]) if ek is not None else [None] * (j - i)
        run_extra += [None] * (j - i - len(run_extra))
        hashes = event.block_hashes[i:j]
        tokens = event.token_ids[i * bs : j * bs]
        if (cur is not None and meta == cur_meta and parent == cur.block_hashes[-1]
                and len(cur.block_hashes) + (j - i) <= max_blocks):
            cur.block_hashes.extend(hashes)
            cur.token_ids.extend(tokens)
            extras.extend(run_extra)
            continue
        if cur is not None:
            cur.extra_keys = extras if any(e is not None for e in extras) else None
            yield cur
        while j - i > max_blocks:  # a run longer than an event may hold
            head = BlockStored(block_hashes=hashes[:max_blocks], parent_block_hash=parent,
                               token_ids=tokens[: max_blocks * bs], **dict(zip(_META_FIELDS, meta, strict=True)))
            head.extra_keys = run_extra[:max_blocks] if any(e is not None for e in run_extra[:max_blocks]) else None
            yield head
            parent = hashes[max_blocks - 1]
            hashes, tokens, run_extra = hashes[max_blocks:], tokens[max_blocks * bs :], run_extra[max_blocks:]
            i += max_blocks
        cur = BlockStored(block_hashes=list(hashes), parent_block_hash=parent, token_ids=list(tokens),
                          **dict(zip(_META_FIELDS, meta, strict=True)))
        cur_meta, extras = meta, list(run_extra)
    if cur is not None:
        cur.extra_keys = extras if any(e is not None for e in extras) else None
        yield cur
