"""The KV event wire schema, byte-compatible with vLLM 0.33's ``vllm.distributed.kv_events``.

A batch travels as a msgpack *array* ``[ts, events, data_parallel_rank]``; each event is a
msgpack *map* whose ``"type"`` key names its class (msgspec ``tag=True``). Fields without a
default are always written; fields that default to ``None`` are omitted when unset
(``omit_defaults=True``), so a plain vLLM subscriber sees exactly what vLLM sends.

Decoding is lenient where vLLM versions differ: events may also arrive in the older
positional encoding (``["BlockStored", hashes, parent, ...]``), block hashes may be
unsigned 64-bit ints or raw bytes, and unknown map keys are ignored.
"""

from __future__ import annotations

from typing import Any

import msgspec

# A block hash as events carry it: the low 64 bits of the digest as an unsigned int (vLLM's
# convention). Some vLLM versions send the raw digest bytes instead; ``codec.decode_batch``
# accepts those and converts them, so decoded events always hold ints. (Typing the field as
# int only also lets the fast typed decoder skip a per-hash check: bytes fail validation and
# take the lenient path.)
ExternalBlockHash = int


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of every KV cache event; the msgpack map's ``"type"`` is the class name."""


DEVICE_MEDIUM = "GPU"
"""``medium`` of the engine's own KV cache, on every device (vLLM's block pool writes "GPU" on CPU too)."""
HOST_MEDIUM = "CPU"
"""``medium`` of a host-memory tier below it (vLLM's OffloadingConnector, kvmesh's ``kv_offload_memory``)."""


class BlockStored(KVCacheEvent):
    """Full blocks became cached: a chain of ``len(block_hashes)`` blocks hanging off a parent."""

    block_hashes: list[ExternalBlockHash]
    """External hashes of the stored blocks, in chain order."""
    parent_block_hash: ExternalBlockHash | None
    """Hash of the block before ``block_hashes[0]``; None when the chain starts the prompt."""
    token_ids: list[int]
    """The tokens of all stored blocks: ``len == block_size * len(block_hashes)``."""
    block_size: int
    """Tokens per block."""
    lora_id: int | None
    """Integer id of the LoRA adapter the blocks were computed with, if any (deprecated in vLLM, kept for old
    consumers: the id is the engine's own handle, so ``lora_name`` is what a router keys on)."""
    medium: str | None
    """The tier holding the blocks, in vLLM's values: ``DEVICE_MEDIUM`` ("GPU", the engine's own cache on every
    device) or ``HOST_MEDIUM`` ("CPU", a host-memory tier)."""
    lora_name: str | None
    """Name of the LoRA adapter the blocks were computed with (the request's ``"model"``), if any; also one of
    every block's extra hash keys, so two adapters never share a block."""
    extra_keys: list[Any] | None = None
    """Extra hash keys per block, one entry per hash (None or a list: the cache-salt key on block 0, the LoRA
    name on every block), when the engine reports them -- enough for a consumer to recompute the hashes."""
    group_idx: int | None = None
    """KV cache group the blocks belong to (hybrid models); None for a single group."""
    kv_cache_spec_kind: str | None = None
    """Kind of KV cache spec of the group (full attention, sliding window, ...)."""
    kv_cache_spec_sliding_window: int | None = None
    """Sliding window of the group's spec, when it has one."""
    kv_cache_spec_attention_chunk_size: int | None = None
    """Chunk size of chunked local attention, when the group uses it."""
    kv_cache_spec_num_kv_heads: int | None = None
    """KV heads of the group's spec."""
    kv_cache_spec_head_size: int | None = None
    """Head size of the group's spec."""
    kv_cache_spec_dtype: str | None = None
    """Cache dtype of the group's spec."""
    kv_cache_spec_page_size_bytes: int | None = None
    """Page size in bytes of the group's spec."""
    locality: str | None = None
    """``"LOCAL"`` or ``"REMOTE"``: where the tier holding the blocks lives relative to the publisher (vLLM sets
    it for file-system / object-store tiers); None when unspecified. kvmesh's own tiers leave it unset."""
    ownership: str | None = None
    """The secondary (offloading) tier that emitted the event, when one did; None for the engine's own cache."""
    session_id: str | None = None
    """The session of the request whose store (or reuse report) this is -- not an owner: blocks are shared."""
    lookahead_token_ids: list[int] | None = None
    """Tokens after the chain's last block that its hash covers (EAGLE-style lookahead hashing), when used."""

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"BlockStored.block_size must be positive, got {self.block_size}")


class BlockRemoved(KVCacheEvent):
    """Blocks were evicted from the cache."""

    block_hashes: list[ExternalBlockHash]
    """External hashes of the evicted blocks."""
    medium: str | None
    """Where the blocks lived (``"GPU"`` / ``"CPU"``)."""
    group_idx: int | None = None
    """KV cache group of the blocks; None for a single group."""
    locality: str | None = None
    """``"LOCAL"`` / ``"REMOTE"`` as on ``BlockStored`` (vLLM writes it on both for symmetry)."""
    ownership: str | None = None
    """The secondary tier that emitted the event, as on ``BlockStored``."""


class AllBlocksCleared(KVCacheEvent):
    """The whole cache was reset (prefix-cache reset, or a replica restart)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What one engine step publishes: ``[ts, events, data_parallel_rank]`` on the wire."""

    ts: float
    """Wall-clock time (seconds since the epoch) when the batch was made."""
    events: list[Any]
    """The events of the step, oldest first."""
    data_parallel_rank: int | None = None
    """Data-parallel rank of the engine that published the batch."""


class KVEventBatch(EventBatch):
    """A batch of KV cache events."""

    events: list[KVEvent]
