"""decode_batch reads every vLLM dialect; encode_batch writes vLLM 0.33's bytes."""

import msgspec
import pytest
from kvmesh.events.codec import DecodeError, decode_batch, decode_batch_counted, encode_batch
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

BIG = (1 << 64) - 1  # a u64 hash >= 2^63 must survive as unsigned


def stored(**kw):
    base = dict(block_hashes=[BIG, 2], parent_block_hash=1 << 63, token_ids=[1, 2, 3, 4], block_size=2,
                lora_id=None, medium="GPU", lora_name=None)
    base.update(kw)
    return BlockStored(**base)


@pytest.mark.parametrize(
    "event",
    [
        stored(),
        stored(parent_block_hash=None, lora_id=3, lora_name="adapter", medium="CPU"),
        stored(extra_keys=[["salt"], None], group_idx=1, kv_cache_spec_kind="full_attention",
               kv_cache_spec_sliding_window=128, kv_cache_spec_num_kv_heads=8, kv_cache_spec_head_size=64,
               kv_cache_spec_dtype="bfloat16", kv_cache_spec_page_size_bytes=4096,
               kv_cache_spec_attention_chunk_size=256),
        BlockRemoved(block_hashes=[BIG], medium="GPU"),
        BlockRemoved(block_hashes=[5, 6], medium=None, group_idx=2),
        AllBlocksCleared(),
    ],
    ids=["stored", "stored-lora-root", "stored-all-optional", "removed", "removed-group", "cleared"],
)
def test_every_event_type_round_trips(event):
    batch = KVEventBatch(ts=12.5, events=[event], data_parallel_rank=3)
    assert decode_batch(encode_batch(batch)) == batch


def test_legacy_positional_events_decode():
    legacy = [1.0, [
        ["BlockStored", [BIG, 2], 7, [1, 2, 3, 4], 2, None, "GPU"],   # no lora_name (older vLLM)
        ["BlockRemoved", [BIG], "GPU"],
        ["AllBlocksCleared"],
    ], 0]
    batch = decode_batch(msgspec.msgpack.encode(legacy))
    assert batch.events == [
        stored(parent_block_hash=7),
        BlockRemoved(block_hashes=[BIG], medium="GPU"),
        AllBlocksCleared(),
    ]


def test_legacy_batch_without_data_parallel_rank_decodes():
    batch = decode_batch(msgspec.msgpack.encode([2.0, [["AllBlocksCleared"]]]))
    assert batch.data_parallel_rank is None and batch.events == [AllBlocksCleared()]


def test_bytes_hashes_decode_to_their_low_64_bits():
    digest = bytes(range(16))
    raw = [1.0, [{"type": "BlockStored", "block_hashes": [digest], "parent_block_hash": digest[::-1],
                  "token_ids": [9, 9], "block_size": 2, "lora_id": None, "medium": "GPU"},
                 {"type": "BlockRemoved", "block_hashes": [digest], "medium": "GPU"}], 0]
    batch = decode_batch(msgspec.msgpack.encode(raw))
    low = int.from_bytes(digest[8:], "big")
    assert batch.events[0].block_hashes == [low]
    assert batch.events[0].parent_block_hash == int.from_bytes(digest[::-1][8:], "big")
    assert batch.events[1].block_hashes == [low]


def test_bytes_hashes_agree_with_kvcache_external_hash():
    from kvmesh.kvcache.hashing import external_hash

    digest = bytes(range(100, 116))
    raw = [1.0, [{"type": "BlockRemoved", "block_hashes": [digest], "medium": "CPU"}], 0]
    assert decode_batch(msgspec.msgpack.encode(raw)).events[0].block_hashes == [external_hash(digest)]


def test_unknown_keys_are_ignored():
    raw = [1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "from_the_future": [1, 2]}], 0]
    assert decode_batch(msgspec.msgpack.encode(raw)).events == [BlockRemoved(block_hashes=[1], medium="GPU")]


def test_unknown_event_types_are_dropped_and_counted():
    raw = [1.0, [{"type": "BlockMoved", "block_hashes": [1]}, ["BlockTeleported", 1],
                 {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}], 0]
    decoded = decode_batch_counted(msgspec.msgpack.encode(raw))
    assert decoded.unknown_events == 2
    assert decoded.batch.events == [BlockRemoved(block_hashes=[1], medium="GPU")]


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode({"ts": 1}),
                                     msgspec.msgpack.encode([1.0]), msgspec.msgpack.encode(["x", []])])
def test_malformed_payloads_raise_decode_error(payload):
    with pytest.raises(DecodeError):
        decode_batch(payload)
