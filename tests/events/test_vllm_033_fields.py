"""Every field of vLLM 0.33's BlockStored / BlockRemoved survives a decode and re-encode (no loss)."""

import msgspec
import pytest
from kvmesh.events.codec import decode_batch, encode_batch
from kvmesh.events.schema import BlockRemoved, BlockStored
from kvmesh.events.state import CachedBlockSet

STORED_033 = {
    "type": "BlockStored", "block_hashes": [(1 << 64) - 1, 2], "parent_block_hash": 1 << 63,
    "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": 7, "medium": "GPU", "lora_name": "tiny",
    "extra_keys": [["tiny", "0f" * 16], ["tiny"]], "group_idx": 0, "kv_cache_spec_kind": "full_attention",
    "kv_cache_spec_sliding_window": 128, "locality": "REMOTE", "ownership": "fs-tier-0",
    "session_id": "chat-42", "lookahead_token_ids": [5],
}
REMOVED_033 = {"type": "BlockRemoved", "block_hashes": [9, 10], "medium": "CPU", "group_idx": 1,
               "locality": "LOCAL", "ownership": "fs-tier-0"}


def _wire(events: list[dict]) -> bytes:
    return msgspec.msgpack.encode([1700000000.25, events, 0])


@pytest.mark.parametrize("event", [STORED_033, REMOVED_033], ids=["BlockStored", "BlockRemoved"])
def test_a_vllm_033_event_round_trips_field_for_field(event):
    batch = decode_batch(_wire([event]))
    assert msgspec.msgpack.decode(encode_batch(batch)) == [1700000000.25, [event], 0]


def test_the_decoded_fields_are_typed():
    stored, removed = decode_batch(_wire([STORED_033, REMOVED_033])).events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert (stored.locality, stored.ownership, stored.session_id) == ("REMOTE", "fs-tier-0", "chat-42")
    assert stored.lookahead_token_ids == [5] and stored.lora_name == "tiny" and stored.lora_id == 7
    assert stored.extra_keys == [["tiny", "0f" * 16], ["tiny"]]
    assert (removed.group_idx, removed.locality, removed.ownership) == (1, "LOCAL", "fs-tier-0")


def test_the_lenient_path_keeps_the_new_fields_too():
    # raw digest bytes as a hash force the lenient decoder
    event = dict(STORED_033, block_hashes=[bytes(range(16)), 2])
    (stored,) = decode_batch(_wire([event])).events
    assert stored.block_hashes[0] == int.from_bytes(bytes(range(8, 16)), "big")
    assert (stored.session_id, stored.lookahead_token_ids, stored.locality) == ("chat-42", [5], "REMOTE")


def test_unset_new_fields_are_not_written():
    event = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None,
                        medium="GPU", lora_name=None)
    (raw,) = msgspec.msgpack.decode(encode_batch(decode_batch(_wire([msgspec.to_builtins(event)]))))[1]
    assert set(raw) == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                        "medium", "lora_name"}


def test_a_snapshot_keeps_the_adapter_and_the_new_fields():
    (stored,) = decode_batch(_wire([STORED_033])).events
    base = BlockStored(block_hashes=[3], parent_block_hash=stored.block_hashes[-1], token_ids=[5, 6], block_size=2,
                       lora_id=None, medium="GPU", lora_name=None)
    s = CachedBlockSet()
    s.apply_all([stored, base])
    snap = s.snapshot()
    # the base block continues the adapter's chain but is not the adapter's: two events
    assert [(e.block_hashes, e.lora_name) for e in snap] == [(stored.block_hashes, "tiny"), ([3], None)]
    assert snap[0].session_id == "chat-42" and snap[0].extra_keys == stored.extra_keys
    replayed = CachedBlockSet()
    replayed.apply_all(snap)
    assert replayed.keys() == s.keys()


def test_events_tail_names_the_adapter():
    import json

    from kvmesh.cluster.commands.events import event_json, format_event

    (stored,) = decode_batch(_wire([STORED_033])).events
    assert format_event("r0", 3, stored).split()[-1] == "lora=tiny"
    assert "lora=" not in format_event("r0", 3, msgspec.structs.replace(stored, lora_name=None))
    row = json.loads(event_json("r0", 3, 1.0, stored))
    assert row["lora_name"] == "tiny" and row["extra_keys"] == [["tiny", "0f" * 16], ["tiny"]]
