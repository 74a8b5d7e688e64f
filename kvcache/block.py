"""One fixed-size block of the paged KV cache, as the block pool sees it."""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.kvcache.hashing import BlockHash


class KVCacheBlock:
    """A block's bookkeeping; its K/V data lives in the model runner's cache tensor at ``block_id``.

    The free-queue links live on the block itself so that queue operations allocate nothing.
    ``parent_block_hash``, ``token_ids``, ``extra_keys`` and ``lora_name`` are remembered while the
    block is cached so that the pool can describe it again later (``BlockPool.snapshot_events``).
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block",
                 "hit_count", "protected", "parent_block_hash", "token_ids", "extra_keys", "lora_name")

    def __init__(self, block_id: int):
        self.block_id = block_id
        """Index of the block in the KV cache tensor."""
        self.ref_cnt = 0
        """Number of running requests whose block table holds this block."""
        self.block_hash: BlockHash | None = None
        """Hash of the block's content once it is full and cached, else None."""
        self.prev_free_block: KVCacheBlock | None = None
        """Previous block in a free queue (None when the block is in use)."""
        self.next_free_block: KVCacheBlock | None = None
        """Next block in a free queue (None when the block is in use)."""
        self.hit_count = 0
        """Prefix-cache hits on this block since it was cached (frequency-aware eviction reads it)."""
        self.protected = False
        """Which segment of a segmented free queue holds the block (eviction policies' business)."""
        self.parent_block_hash: BlockHash | None = None
        """Hash of the previous block in the request that cached this one (None for block 0)."""
        self.token_ids: Sequence[int] | None = None
        """The block's token ids while it is cached."""
        self.extra_keys: tuple | None = None
        """The block's extra hash keys (salt key, LoRA name) while it is cached."""
        self.lora_name: str | None = None
        """LoRA adapter the block was computed with, while it is cached."""

    @property
    def is_null(self) -> bool:
        """Block 0 is the null block: a placeholder that is never handed out."""
        return self.block_id == 0

    def reset_hash(self) -> None:
        """Forgets the cached content (the block is being recycled or the cache reset)."""
        self.block_hash = None
        self.parent_block_hash = None
        self.token_ids = None
        self.extra_keys = None
        self.lora_name = None
        self.hit_count = 0

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={h})"
