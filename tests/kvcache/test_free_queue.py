"""The intrusive doubly linked free queue."""

import pytest
from kvmesh.kvcache.block import KVCacheBlock
from kvmesh.kvcache.free_queue import FreeKVCacheBlockQueue


def ids(queue):
    return [b.block_id for b in queue.get_all_free_blocks()]


@pytest.fixture
def blocks():
    return [KVCacheBlock(i) for i in range(6)]


def test_popleft_returns_blocks_in_queue_order(blocks):
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.popleft() is blocks[0]
    assert [b.block_id for b in queue.popleft_n(2)] == [1, 2]
    assert ids(queue) == [3, 4, 5] and queue.num_free_blocks == 3


def test_append_and_append_n_go_to_the_tail(blocks):
    queue = FreeKVCacheBlockQueue(blocks[:2])
    queue.append(blocks[5])
    queue.append_n([blocks[3], blocks[2]])
    assert ids(queue) == [0, 1, 5, 3, 2] and len(queue) == 5


def test_remove_unlinks_a_block_from_the_middle(blocks):
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[3])
    assert ids(queue) == [0, 1, 2, 4, 5]
    assert blocks[3].prev_free_block is None and blocks[3].next_free_block is None
    queue.remove(blocks[0])
    queue.remove(blocks[5])
    assert ids(queue) == [1, 2, 4] and queue.num_free_blocks == 3


def test_popped_blocks_are_unlinked(blocks):
    queue = FreeKVCacheBlockQueue(blocks)
    for block in queue.popleft_n(6):
        assert block.prev_free_block is None and block.next_free_block is None
    assert ids(queue) == [] and queue.num_free_blocks == 0


def test_empty_queue_refuses_to_pop(blocks):
    queue = FreeKVCacheBlockQueue()
    with pytest.raises(ValueError, match="empty"):
        queue.popleft()
    with pytest.raises(ValueError, match="only 0"):
        queue.popleft_n(1)


def test_removing_a_block_not_in_the_queue_raises(blocks):
    queue = FreeKVCacheBlockQueue(blocks[:2])
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[4])
