"""A doubly linked list of free blocks, threaded through the blocks themselves (vLLM's design).

::

    head <-> b7 <-> b3 <-> b9 <-> tail        (sentinels at both ends; popleft takes b7)

Every operation is O(1) per block and allocates nothing: ``remove`` unlinks a block from the
middle when a prefix-cache hit revives a free block, which a ``collections.deque`` cannot do.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvmesh.kvcache.block import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: the head is evicted first, freed blocks join at the tail."""

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()):
        self.num_free_blocks = 0
        """Number of blocks in the queue."""
        self.head = KVCacheBlock(-1)
        """Sentinel before the first block."""
        self.tail = KVCacheBlock(-1)
        """Sentinel after the last block."""
        self.head.next_free_block = self.tail
        self.tail.prev_free_block = self.head
        self.append_n(list(blocks))

    def popleft(self) -> KVCacheBlock:
        """Removes and returns the first (least recently freed) block."""
        block = self.head.next_free_block
        if block is self.tail:
            raise ValueError("no free blocks left: the free queue is empty")
        nxt = block.next_free_block
        self.head.next_free_block = nxt
        nxt.prev_free_block = self.head
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Removes and returns the first ``n`` blocks, in order."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        out: list[KVCacheBlock] = []
        block = self.head.next_free_block
        for _ in range(n):
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        self.head.next_free_block = block
        block.prev_free_block = self.head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlinks ``block`` from wherever it sits in the queue."""
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Puts ``block`` at the tail (evicted last)."""
        last = self.tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.tail
        self.tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Puts ``blocks`` at the tail in order (the first of them is evicted first)."""
        if not blocks:
            return
        last = self.tail.prev_free_block
        for block in blocks:
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self.tail
        self.tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All queued blocks in eviction order (for tests and integrity checks; O(n))."""
        out = []
        block = self.head.next_free_block
        while block is not self.tail:
            out.append(block)
            block = block.next_free_block
        return out

    def __len__(self) -> int:
        return self.num_free_blocks
