"""The host tier's copies (replica/worker/kv_offload.py): blocks go down and come back bit for bit, in
the backend's cache layout; on CUDA through pinned memory on a side stream, completion by events."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvmesh.replica.kv_layout import block_layout  # noqa: E402
from kvmesh.replica.worker.kv_offload import KVOffloader, _runs  # noqa: E402


def cache(device: str, num_blocks: int = 9) -> torch.Tensor:
    # [num_layers, 2, num_kv_heads, num_blocks, block_size, head_dim]: the torch backend's layout
    return torch.randn(3, 2, 2, num_blocks, 4, 8, device=device)


def offloader(kv: torch.Tensor, num_host_blocks: int) -> KVOffloader:
    return KVOffloader(kv, block_layout(kv, "L,2,H,blocks,B,D", 4, 2, 8), num_host_blocks)


def round_trip(device: str) -> None:
    kv = cache(device)
    offload = offloader(kv, 6)
    before = kv.clone()
    offload.store(0, [(2, 1), (3, 2), (7, 5)])
    while not offload.finished():  # on CUDA the event fires once the side stream ran
        torch.cuda.synchronize() if kv.is_cuda else None
    offload.load([(1, 4), (2, 5), (5, 8)])  # the copies land in other device blocks
    if kv.is_cuda:
        torch.cuda.synchronize()
    for src, dst in ((2, 4), (3, 5), (7, 8)):
        assert torch.equal(kv.select(3, dst), before.select(3, src))
    for untouched in (0, 1, 2, 3, 6, 7):
        assert torch.equal(kv.select(3, untouched), before.select(3, untouched))
    assert offload.bytes_stored == offload.bytes_loaded == 3 * offload.block_bytes
    assert offload.h2d_bytes_per_s > 0


def test_blocks_copied_down_come_back_bit_for_bit_on_cpu():
    round_trip("cpu")


def test_stores_on_cpu_are_finished_at_once_in_issue_order():
    offload = offloader(cache("cpu"), 4)
    offload.store(5, [(1, 1)])
    offload.store(6, [(2, 2)])
    assert offload.finished() == [5, 6] and offload.finished() == []


def test_consecutive_ids_are_copied_as_runs():
    assert _runs([(1, 4), (2, 5), (3, 6), (7, 1), (8, 2), (9, 9)]) == [(0, 1, 4, 3), (3, 7, 1, 2), (5, 9, 9, 1)]


@pytest.mark.gpu
def test_on_cuda_the_tier_is_pinned_and_copies_run_on_a_side_stream():
    round_trip("cuda")
    offload = offloader(cache("cuda"), 4)
    assert offload.host.is_pinned() and offload.stream is not None
    offload.store(1, [(1, 1)])
    torch.cuda.synchronize()
    assert offload.finished() == [1]
