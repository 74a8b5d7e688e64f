"""The event wire format is vLLM 0.33's, byte for byte."""

import msgspec
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

GOLDEN_HEX = (
    "93cb41d954fc4020000093de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf"
    "1122334455667788cf99aabbccddeeff00b1706172656e745f626c6f636b5f6861736807a9746f6b656e5f6964739801"
    "02030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d"
    "65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf1122334455667788a66d6564"
    "69756da343505581a474797065b0416c6c426c6f636b73436c656172656400"
)


def golden_batch() -> KVEventBatch:
    return KVEventBatch(
        ts=1700000000.5,
        events=[
            BlockStored(
                block_hashes=[0x1122334455667788, 0x99AABBCCDDEEFF00],
                parent_block_hash=7,
                token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
                block_size=4,
                lora_id=None,
                medium="CPU",
                lora_name=None,
            ),
            BlockRemoved(block_hashes=[0x1122334455667788], medium="CPU"),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def test_golden_batch_encodes_to_vllm_bytes():
    assert msgspec.msgpack.encode(golden_batch()).hex() == GOLDEN_HEX


def test_golden_bytes_decode_to_the_same_batch():
    decoded = msgspec.msgpack.decode(bytes.fromhex(GOLDEN_HEX), type=KVEventBatch)
    assert decoded == golden_batch()
