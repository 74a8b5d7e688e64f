"""CachedBlockSet folds events; its snapshot reproduces it as parent-first chains."""

from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored
from kvmesh.events.state import CachedBlockSet


def stored(hashes, parent, medium="CPU", bs=2, **kw):
    tokens = [t for h in hashes for t in (h % 100, h % 100 + 1)][: bs * len(hashes)]
    return BlockStored(block_hashes=list(hashes), parent_block_hash=parent, token_ids=tokens, block_size=bs,
                       lora_id=None, medium=medium, lora_name=None, **kw)


def replay(events):
    s = CachedBlockSet()
    s.apply_all(events)
    return s


def test_store_remove_clear():
    s = replay([stored([1, 2, 3], None), BlockRemoved(block_hashes=[2], medium="CPU")])
    assert s.keys() == {("CPU", 1), ("CPU", 3)}
    s.apply(AllBlocksCleared())
    assert len(s) == 0


def test_media_are_tracked_separately():
    s = replay([stored([1], None, medium="GPU"), stored([1], None, medium="CPU"),
                BlockRemoved(block_hashes=[1], medium="GPU")])
    assert s.keys() == {("CPU", 1)}


def test_snapshot_is_one_chain_per_unbroken_run():
    s = replay([stored([1, 2], None), stored([3], 2), stored([10], None)])
    snap = s.snapshot()
    assert [e.block_hashes for e in snap] == [[1, 2, 3], [10]]
    assert snap[0].parent_block_hash is None and snap[0].token_ids == [1, 2, 2, 3, 3, 4]


def test_snapshot_puts_parents_first_even_when_a_parent_was_restored_later():
    # 1 <- 2 ; evict 1 ; store 1 again (now newer than its child in insertion order)
    s = replay([stored([1, 2], None), BlockRemoved(block_hashes=[1], medium="CPU"), stored([1], None)])
    snap = s.snapshot()
    order = [h for e in snap for h in e.block_hashes]
    assert order.index(1) < order.index(2)
    assert replay(snap).keys() == s.keys()


def test_orphans_keep_their_recorded_parent():
    s = replay([stored([1, 2, 3], None), BlockRemoved(block_hashes=[2], medium="CPU")])
    snap = s.snapshot()
    three = next(e for e in snap if 3 in e.block_hashes)
    assert three.parent_block_hash == 2


def test_snapshot_keeps_per_block_extra_keys_and_respects_max_blocks():
    s = replay([stored([1, 2, 3], None, extra_keys=[["salt"], None, None])])
    snap = s.snapshot(max_blocks_per_event=2)
    assert [e.block_hashes for e in snap] == [[1, 2], [3]]
    assert snap[0].extra_keys == [["salt"], None] and snap[1].extra_keys is None
    assert snap[1].parent_block_hash == 2
