"""The router's prefix index: which replica holds which leading blocks of a prompt.

Fed by each replica's KV event stream. One global dict maps a router key (router/routing/keys.py) to a
bitmask of the replicas that hold the block; each replica owns one bit (its *slot*)::

    _blocks: {router_key: 0b1010}       replicas in slots 1 and 3 hold this block
    replica.ext_to_key: {external_hash: router_key}   to apply BlockRemoved

A match walks the request's keys AND-ing the masks while the set is non-empty, so a replica
counts a block only while the chain up to it is unbroken. The masks come in runs of equal values
(``groupby``, in C); the AND changes only where a run starts, so Python touches each run once.
When the compiled fast path is built (router/_native/fastpath.c) the same walk runs in C, with
identical results; the Python walk stays as the fallback and for more than 64 replica slots. What a
replica's BlockStored and BlockRemoved events do to its entry: router/routing/block_events.py.

*Predicted* entries: when the router sends a request to a replica it credits that replica with the
request's blocks for ``predict_ttl_s`` (bits set in ``_blocks`` and recorded in ``predictions.predicted``),
until the real ``BlockStored`` events arrive. A burst of requests sharing a new prefix then goes
to one replica instead of scattering. Invariant: a predicted bit is never also a real one.

*Tiers*: events with vLLM's ``medium="CPU"`` describe a replica's host-memory tier (kvmesh's
``--kv-offload-memory``, vLLM's OffloadingConnector). The tier is a field of the replica's entry
(``ReplicaBlocks.host``, made on its first such event) with a slot of its own in the same masks, as
llm-d keeps a (pod, tier) per block: one walk of the masks answers both tiers, and a cluster without
tiers has no host slot at all. Every other medium ("GPU", None) is the engine's own cache.
``AllBlocksCleared`` clears both.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from kvmesh.events.schema import HOST_MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.block_events import BlockEvents
from kvmesh.router.routing.index_stats import HostTierSlot, IndexStats, ReplicaBlocks, by_tier
from kvmesh.router.routing.keys import FASTPATH, RouterKeyHasher
from kvmesh.router.routing.predictions import Predictions
from kvmesh.router.routing.prefix_match import match_masks
from kvmesh.router.routing.tier_matches import TierMatches


class PrefixIndex(BlockEvents):
    """Per-replica cached blocks under router keys, matched against a request's keys."""

    def __init__(self, block_size: int = 16, hasher: RouterKeyHasher | None = None,
                 predict_ttl_s: float = 2.0) -> None:
        self.hasher = hasher or RouterKeyHasher(block_size)
        """Computes router keys; its block size and seed must match the one hashing requests."""
        self.block_size = self.hasher.block_size
        """Tokens per block (events with another block size are counted and dropped)."""
        self._blocks: dict[int, int] = {}             # router_key -> bits of the replicas holding it
        self.predictions = Predictions(self._blocks, predict_ttl_s)
        """Blocks credited to the replica a request was routed to, until events confirm them."""
        self._replicas: dict[ReplicaId, ReplicaBlocks] = {}
        self._slot_owner: list[ReplicaId | HostTierSlot | None] = []
        self._free_slots: list[int] = []
        self.host_tiers = 0
        """Replicas whose host tier holds a slot (0: every slot is a GPU pool's, matches need no sorting)."""
        self.stats = IndexStats()
        """Counters: events applied, blocks stored/removed, orphans, mismatched block sizes."""

    # ---------------------------------------------------------------- replicas
    def add_replica(self, replica_id: ReplicaId) -> ReplicaBlocks:
        """Register a replica (idempotent); returns its tree."""
        tree = self._replicas.get(replica_id)
        if tree is None:
            tree = self._replicas[replica_id] = ReplicaBlocks(replica_id, self._take_slot(replica_id))
            self.predictions.version += 1  # the masks' version (predictions.py): a match may change
        return tree

    def _take_slot(self, owner: ReplicaId | HostTierSlot) -> int:
        if self._free_slots:
            slot = self._free_slots.pop()
            self._slot_owner[slot] = owner
        else:
            slot = len(self._slot_owner)
            self._slot_owner.append(owner)
        return slot

    def _free_slot(self, slot: int) -> None:
        self._slot_owner[slot] = None
        self._free_slots.append(slot)

    def _host_tree(self, tree: ReplicaBlocks) -> ReplicaBlocks:
        """The replica's host tier, made with a slot of its own on its first host-tier event."""
        host = tree.host
        if host is None:
            host = tree.host = ReplicaBlocks(tree.replica_id, self._take_slot(HostTierSlot(tree.replica_id)))
            self.host_tiers += 1
        return host

    def remove_replica(self, replica_id: ReplicaId) -> None:
        """Forget a replica and everything it held; its slot is reused later."""
        tree = self._replicas.get(replica_id)
        if tree is None:
            return
        self.clear_replica(replica_id)
        del self._replicas[replica_id]
        self._free_slot(tree.slot)
        if tree.host is not None:
            self._free_slot(tree.host.slot)
            self.host_tiers -= 1

    def clear_replica(self, replica_id: ReplicaId) -> None:
        """Drop a replica's whole tree (AllBlocksCleared, restart); real and predicted blocks."""
        tree = self._replicas.get(replica_id)
        if tree is None:
            return
        self.predictions.version += 1
        if tree.host is not None:
            self._clear_tree(tree.host)
        self.predictions.forget(tree.bit)
        self._clear_tree(tree)

    def _clear_tree(self, tree: ReplicaBlocks) -> None:
        """Drop the real blocks of one tier's tree (its predictions are the caller's)."""
        mask_off, blocks = ~tree.bit, self._blocks
        for key in set(tree.ext_to_key.values()):
            mask = blocks.get(key, 0) & mask_off
            if mask:
                blocks[key] = mask
            else:
                blocks.pop(key, None)
        tree.ext_to_key.clear()
        tree.orphans.clear()
        tree.orphan_parent.clear()
        tree.ext_dups.clear()
        tree.key_dups.clear()

    @property
    def replica_ids(self) -> list[ReplicaId]:
        return list(self._replicas)

    def num_blocks(self, replica_id: ReplicaId | None = None) -> int:
        """Blocks really held (no predictions): by one replica in its GPU pool, or distinct keys over all (host
        tiers' included)."""
        if replica_id is None:
            return len(self._blocks) - len(self.predictions.predicted)
        tree = self._replicas.get(replica_id)
        if tree is None:
            return 0
        return len(tree.ext_to_key) + len(tree.orphan_parent) + sum(tree.ext_dups.values())

    @property
    def num_keys(self) -> int:
        """Distinct router keys in the index (real and predicted, host tiers' included)."""
        return len(self._blocks)

    def cached_hashes(self, replica_id: ReplicaId) -> set:
        """The external block hashes a replica holds, as far as its events say."""
        tree = self._replicas.get(replica_id)
        return set() if tree is None else set(tree.ext_to_key) | set(tree.orphan_parent)

    # ---------------------------------------------------------------- events
    def apply(self, replica_id: ReplicaId, batch_or_events) -> None:
        """Apply a KVEventBatch (or a list of events) published by ``replica_id``."""
        events = batch_or_events.events if isinstance(batch_or_events, EventBatch) else batch_or_events
        tree = self._replicas.get(replica_id) or self.add_replica(replica_id)
        self.predictions.version += 1
        stats = self.stats
        for event in events:
            if type(event) is BlockStored:
                self._store(self._host_tree(tree) if event.medium == HOST_MEDIUM else tree, event)
            elif type(event) is BlockRemoved:
                self._remove(self._host_tree(tree) if event.medium == HOST_MEDIUM else tree, event.block_hashes)
            elif type(event) is AllBlocksCleared:
                self.clear_replica(replica_id)
                stats.clears += 1
            stats.events += 1

    # ---------------------------------------------------------------- predictions
    @property
    def predict_ttl_s(self) -> float:
        return self.predictions.ttl_s

    def predict(self, replica_id: ReplicaId, keys: Sequence[int], now: float | None = None, start: int = 0) -> int:
        """Credit ``replica_id`` with ``keys[start:]`` until events confirm them or ``predict_ttl_s``
        passes (router/routing/predictions.py); returns the blocks newly credited."""
        tree = self._replicas.get(replica_id)
        return 0 if tree is None else self.predictions.predict(tree.bit, keys, now, start)

    def predict_held(self, replica_id: ReplicaId, keys: Sequence[int], now: float | None, start: int,
                     hold_s: float) -> int | None:
        """``predict`` held until ``predictions.release(ticket)`` (at most ``hold_s``); the ticket, or None."""
        tree = self._replicas.get(replica_id)
        now = time.monotonic() if now is None else now
        return None if tree is None else self.predictions.predict_held(tree.bit, keys, now, start, hold_s)

    # ---------------------------------------------------------------- matching
    def match(self, keys: Sequence[int], now: float | None = None) -> dict[ReplicaId, int]:
        """Per replica, the number of leading blocks of ``keys`` its GPU pool holds (replicas with 0 omitted)."""
        if not self.host_tiers:
            return self._match_slots(keys, now)
        return self.match_tiers(keys, now).device  # type: ignore[return-value]  # match_tiers makes dicts

    def match_tiers(self, keys: Sequence[int], now: float | None = None, pullable: bool = False) -> TierMatches:
        """``match`` per tier: the GPU pools' (predictions included) and the host tiers' (empty without any), from
        one walk of the masks; with ``pullable``, the GPU pools' without predictions too (``TierMatches.pullable``)."""
        held = self._match_slots(keys, now)
        device, host = by_tier(held) if self.host_tiers else (held, {})
        return TierMatches(device, host, self.held(keys, device) if pullable else None)

    def held(self, keys: Sequence[int], matches: Mapping[ReplicaId, int]) -> dict[ReplicaId, int]:
        """``matches`` (from ``match``) cut at each replica's first block only predicted: the blocks its events
        confirmed, what a peer pull can move from it now."""
        return self.predictions.real(keys, matches, self._replicas)

    def _match_slots(self, keys: Sequence[int], now: float | None) -> dict:
        """Per slot's owner (a replica's id, or its ``HostTierSlot``), the leading blocks of ``keys`` it holds."""
        if self.predictions.queue or self.predictions.backstops:
            self.predictions.expire(time.monotonic() if now is None else now)
        if self.hasher.native:
            out = FASTPATH.match(self._blocks, keys, self._slot_owner)
            if out is not None:  # None: a mask wider than 64 slots, left to the Python walk
                return out
        return self._match_py(keys)

    def _match_py(self, keys: Sequence[int]) -> dict:
        """``_match_slots`` in Python (no compiled fast path, or more than 64 slots)."""
        return match_masks(self._blocks, keys, self._slot_owner)

