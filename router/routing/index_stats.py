"""Per-replica state, counters and slot owners of the prefix index (router/routing/index.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.router.replicas.replica import ReplicaId


@dataclass(slots=True)
class ReplicaBlocks:
    """What the index knows about one replica's cache."""

    replica_id: ReplicaId
    """The replica's id, as the caller names it."""
    slot: int
    """Bit position of this replica in the index's masks."""
    ext_to_key: dict = field(default_factory=dict)
    """The replica's external block hash -> router key, for every block it holds."""
    orphans: dict = field(default_factory=dict)
    """Parent external hash -> [(external hash, token bytes, extra keys)] of blocks waiting for it."""
    orphan_parent: dict = field(default_factory=dict)
    """External hash of each parked orphan block -> its parent's external hash."""
    ext_dups: dict = field(default_factory=dict)
    """External hashes stored more than once (extra copies), so one BlockRemoved leaves the block."""
    key_dups: dict = field(default_factory=dict)
    """Router keys reached by more than one external hash of this replica (extra references)."""
    host: ReplicaBlocks | None = None
    """Its host-memory tier (events with medium "CPU"): the same bookkeeping under a bit of its own in the same
    masks, made on its first host-tier event; None: no tier announced."""

    @property
    def bit(self) -> int:
        return 1 << self.slot


@dataclass(slots=True)
class IndexStats:
    """Counters of the events an index applied."""

    events: int = 0
    """Events applied (all types)."""
    blocks_stored: int = 0
    """Blocks announced by BlockStored and keyed."""
    blocks_removed: int = 0
    """Blocks removed by BlockRemoved."""
    clears: int = 0
    """AllBlocksCleared events applied."""
    orphan_blocks: int = 0
    """Stored blocks parked because their parent was unknown (evicted earlier, or events missed)."""
    unknown_removals: int = 0
    """BlockRemoved hashes the replica was not known to hold."""
    bad_events: int = 0
    """BlockStored events dropped because their token ids could not be packed."""
    bad_block_size: int = 0
    """Stored blocks dropped because the event's block size differs from the router's."""


@dataclass(frozen=True, slots=True, eq=False)
class HostTierSlot:
    """The owner of a host tier's slot (``PrefixIndex._slot_owner``): a match credits it, not the replica's id, so
    ``match_tiers`` tells the tiers apart."""

    replica_id: ReplicaId


def by_tier(held: dict) -> tuple[dict[ReplicaId, int], dict[ReplicaId, int]]:
    """A walk's matches per slot owner split by tier: (the GPU pools', the host tiers'), each by replica id."""
    device: dict[ReplicaId, int] = {}
    host: dict[ReplicaId, int] = {}
    for owner, blocks in held.items():
        if type(owner) is HostTierSlot:
            host[owner.replica_id] = blocks
        else:
            device[owner] = blocks
    return device, host
