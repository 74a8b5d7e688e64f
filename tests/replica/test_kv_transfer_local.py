"""The KV block layout and the in-process transport: what every transport must do, without nixl."""

from __future__ import annotations

import time

import pytest
import torch
from kvmesh.replica.attention.torch_backend import TorchAttentionBackend
from kvmesh.replica.attention.triton_backend import TritonAttentionBackend
from kvmesh.replica.kv_layout import block_layout, symbolic_layout
from kvmesh.replica.kv_transfer.agent import (
    KVTransferConfig,
    decode_handshake,
    encode_handshake,
    make_kv_transfer_agent,
    read_blocks,
    wait,
)
from kvmesh.replica.kv_transfer.errors import KVLayoutMismatch, KVTransferError, KVTransferTimeout

LAYERS, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 3, 10, 4, 2, 8
BACKENDS = [TorchAttentionBackend, TritonAttentionBackend]


def _cache(backend, num_blocks=NUM_BLOCKS, dtype=torch.float32, block_size=BLOCK_SIZE):
    shape = backend.kv_cache_shape(num_blocks, block_size, HEADS, HEAD_DIM)
    cache = torch.randn(LAYERS, *shape).to(dtype)
    return cache, block_layout(cache, symbolic_layout(backend.kv_cache_shape), block_size, HEADS, HEAD_DIM)


def _agent(name, cache, layout):
    return make_kv_transfer_agent(KVTransferConfig(transport="local"), name, cache, layout)


def _per_block(cache, layout):
    """[num_regions, num_blocks, elements of one region of one block]."""
    return cache.view(layout.num_regions, layout.num_blocks, -1)


@pytest.fixture
def agents():
    made = []
    yield lambda *args: made.append(_agent(*args)) or made[-1]
    for agent in made:
        agent.close()


def test_the_local_transport_implements_the_agent_interface(agents):
    from kvmesh.replica.kv_transfer.agent import KVTransfer, KVTransferAgent

    holder, reader = agents("holder", *_cache(TorchAttentionBackend)), agents("reader", *_cache(TorchAttentionBackend))
    assert isinstance(reader, KVTransferAgent)
    assert isinstance(reader.start_read(reader.add_peer(holder.handshake()), [1], [1]), KVTransfer)


def test_backend_layouts_are_named_by_their_dimensions():
    assert symbolic_layout(TorchAttentionBackend.kv_cache_shape) == "L,2,H,blocks,B,D"
    assert symbolic_layout(TritonAttentionBackend.kv_cache_shape) == "L,2,blocks,B,H,D"


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_descriptors_address_each_region_of_each_block(backend):
    cache, layout = _cache(backend)
    assert layout.bytes_per_block == LAYERS * 2 * BLOCK_SIZE * HEADS * HEAD_DIM * 4
    descriptors = layout.descriptors()
    outer = cache.view(layout.num_regions, NUM_BLOCKS, -1)  # region r of block b: outer[r, b]
    for r in (0, layout.num_regions - 1):
        for b in (1, NUM_BLOCKS - 1):
            address, length, _ = descriptors[layout.descriptor_ids([b])[r]]
            assert address == outer[r, b].data_ptr() and length == layout.block_stride
    # region r of block b is the slice of the cache indexed by the outer dims, then b
    layer, kv = 1, 1
    first_region_of_layer_v = (layer * 2 + kv) * (layout.num_regions // (LAYERS * 2))
    address, _, _ = descriptors[layout.descriptor_ids([3])[first_region_of_layer_v]]
    block = cache[layer, kv, 0, 3] if backend is TorchAttentionBackend else cache[layer, kv, 3]
    assert address == block.data_ptr()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_local_read_copies_the_peer_blocks_into_the_given_ids(backend, agents):
    holder_cache, holder_layout = _cache(backend)
    reader_cache, reader_layout = _cache(backend, num_blocks=NUM_BLOCKS + 5)
    before = reader_cache.clone()
    holder = agents("holder", holder_cache, holder_layout)
    reader = agents("reader", reader_cache, reader_layout)
    peer = reader.add_peer(decode_handshake(encode_handshake(holder.handshake())))
    read_blocks(reader, peer, [7, 2, 9], [1, 12, 5])
    got, held = _per_block(reader_cache, reader_layout), _per_block(holder_cache, holder_layout)
    assert torch.equal(got[:, [1, 12, 5]], held[:, [7, 2, 9]])
    others = [b for b in range(NUM_BLOCKS + 5) if b not in (1, 12, 5)]
    assert torch.equal(got[:, others], _per_block(before, reader_layout)[:, others])


def test_a_peer_with_another_block_size_or_layout_is_refused_naming_the_fields(agents):
    reader = agents("reader", *_cache(TorchAttentionBackend))
    other_size = agents("other-size", *_cache(TorchAttentionBackend, block_size=BLOCK_SIZE * 2))
    with pytest.raises(KVLayoutMismatch, match=r"'other-size'.*block_size: 4 vs 8; .*bytes_per_block"):
        reader.add_peer(other_size.handshake())
    other_layout = agents("other-layout", *_cache(TritonAttentionBackend))
    with pytest.raises(KVLayoutMismatch, match=r"kv_layout: L,2,H,blocks,B,D vs L,2,blocks,B,H,D"):
        reader.add_peer(other_layout.handshake())


def test_bad_block_ids_are_refused_before_anything_moves(agents):
    holder = agents("holder", *_cache(TorchAttentionBackend))
    reader_cache, reader_layout = _cache(TorchAttentionBackend)
    before = reader_cache.clone()
    reader = agents("reader", reader_cache, reader_layout)
    peer = reader.add_peer(holder.handshake())
    with pytest.raises(ValueError, match=r"remote block ids \[0\] .*block 0 is the null block"):
        read_blocks(reader, peer, [0], [1])
    with pytest.raises(ValueError, match=r"local block ids \[10\] are outside 1..9"):
        read_blocks(reader, peer, [1], [10])
    assert torch.equal(reader_cache, before)


def test_reading_from_an_unknown_or_closed_peer_is_a_transfer_error(agents):
    holder = agents("holder", *_cache(TorchAttentionBackend))
    reader = agents("reader", *_cache(TorchAttentionBackend))
    with pytest.raises(KVTransferError, match="'holder' is not a peer of 'reader'"):
        read_blocks(reader, "holder", [1], [1])
    peer = reader.add_peer(holder.handshake())
    holder.close()
    with pytest.raises(KVTransferError, match="gone"):
        read_blocks(reader, peer, [1], [1])


def test_config_names_the_transports_it_knows():
    with pytest.raises(ValueError, match="transport 'rdma' is unknown; choose one of nixl, local"):
        KVTransferConfig(transport="rdma")
    with pytest.raises(ValueError, match="must be positive"):
        KVTransferConfig(timeout_s=0)


class StuckTransfer:
    """A transfer whose peer never answers (PROC until aborted; the transport then confirms it stopped) or that
    fails (ERR)."""

    def __init__(self, state: str) -> None:
        self.num_blocks, self._state, self.released, self.aborted = 3, state, False, False

    def state(self) -> str:
        return self._state

    def abort(self) -> None:
        self.aborted, self._state = True, "ERR"

    def release(self) -> bool:
        self.released = True
        return True


class LateTransfer:
    """A transfer that ignores abort and keeps writing until ``lands_at``; its handle cannot be released before."""

    def __init__(self, lands_at: float) -> None:
        self.num_blocks, self.lands_at, self.aborted = 3, lands_at, False

    def state(self) -> str:
        return "PROC" if time.monotonic() < self.lands_at else "DONE"

    def abort(self) -> None:
        self.aborted = True

    def release(self) -> bool:
        return time.monotonic() >= self.lands_at


def test_a_transfer_that_never_finishes_times_out_and_one_that_fails_raises(agents):
    reader = agents("reader", *_cache(TorchAttentionBackend))
    stuck = StuckTransfer("PROC")
    with pytest.raises(KVTransferTimeout, match=r"reading 3 KV blocks from 'holder' did not finish within 0.05 s"):
        wait(reader, stuck, "holder", timeout_s=0.05)
    failed = StuckTransfer("ERR")
    with pytest.raises(KVTransferError, match=r"failed \(transfer state ERR\); recompute them"):
        wait(reader, failed, "holder")
    assert stuck.aborted and stuck.released and failed.released and not failed.aborted


def test_a_timed_out_transfer_is_waited_on_until_the_transport_lets_it_go(agents):
    reader = agents("reader", *_cache(TorchAttentionBackend))
    late = LateTransfer(time.monotonic() + 0.4)
    with pytest.raises(KVTransferTimeout):
        wait(reader, late, "holder", timeout_s=0.05)
    assert late.aborted and time.monotonic() >= late.lands_at  # not before: the local blocks could still be written
