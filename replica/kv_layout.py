"""Where a replica rank's KV blocks lie in memory: one ``KVBlockLayout``, computed when the runner allocates its
cache (``ModelRunner.kv_layout``, declared on ``ModelRunnerInterface``) and read by the host tier
(worker/kv_offload.py), the KV transfer agent (the layout two peers compare at the handshake) and ``/load``
(``total_bytes_per_block``: the one bytes figure behind ``kv_block_bytes`` and ``kv_transfer.bytes_per_token``).

The cache is one tensor for all layers (replica/worker/kv_cache.py). A block is not one run of
bytes: in every backend's layout the block dimension sits behind some "outer" dimensions, and a
block is one contiguous run in each outer index ("region"):

    torch:             [num_layers, 2, num_kv_heads, num_blocks, block_size, head_dim]
                        \\____ outer: L*2*H regions ____/ ^ block_dim = 3
    flash_attn/triton: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
                        \\ outer: L*2 /  ^ block_dim = 2

    region r, block b  ->  base + r * region_stride + b * block_stride,  block_stride bytes long

    host tier:         [num_host_blocks, <one device block, regions in the same order>]   (kv_offload.py)
    region r, block b  ->  base + r * block_stride + b * bytes_per_block,  block_stride bytes long

(vLLM's NixlConnector describes the same thing per layer: one descriptor per (layer region, block).)
Descriptor ``r * num_blocks + b`` is region r of block b, so a list of block ids becomes descriptor
indices with arithmetic only. Two ranks can exchange blocks when everything but ``num_blocks``
and ``base_address`` agrees; ``mismatch`` names the fields that do not.
"""

from __future__ import annotations

import math

import msgspec
import torch

# The fields that must agree between two ranks for a block id to mean the same bytes on both.
MATCHING_FIELDS = ("num_layers", "block_size", "num_kv_heads", "head_dim", "dtype", "kv_layout", "bytes_per_block",
                   "scales_digest")


class KVBlockLayout(msgspec.Struct, frozen=True):
    """One rank's KV cache as a peer sees it (sent at the handshake)."""

    num_layers: int
    """Attention layers in the cache (its first dimension)."""
    block_size: int
    """Tokens per block."""
    num_kv_heads: int
    """KV heads on this rank (the model's KV heads / tensor-parallel size)."""
    head_dim: int
    """Elements per head."""
    dtype: str
    """torch's name for the element type, e.g. ``"float32"``."""
    kv_layout: str
    """The backend's cache shape with the block dimension named, e.g. ``"L,2,H,blocks,B,D"``."""
    num_blocks: int
    """Blocks in this rank's cache (null block 0 included); may differ between peers."""
    block_dim: int
    """Index of the block dimension in the cache tensor's shape."""
    num_regions: int
    """Contiguous runs one block is made of (the product of the dimensions before ``block_dim``)."""
    region_stride: int
    """Bytes from one region to the next (the stride of dimension ``block_dim - 1``, flattened)."""
    block_stride: int
    """Bytes from one block to the next within a region, and the length of one region of one block."""
    bytes_per_block: int
    """``num_regions * block_stride``: what moving one block moves."""
    base_address: int
    """The cache tensor's first byte in this process."""
    block_step: int = 0
    """Bytes from one block to the next when that differs from ``block_stride`` (0: the same): a host tier
    keeps each block whole (``host_tier_layout``), so its regions are adjacent and its blocks
    ``bytes_per_block`` apart."""
    scales_digest: str = ""
    """An FP8 cache's per-layer k/v scales, digested (replica/worker/kv_scales.py); empty for a cache in the model's
    dtype. Two FP8 caches with other scales hold the same bytes for other values: their blocks are not shareable."""

    def total_bytes_per_block(self, tp_size: int) -> int:
        """Bytes one block of the whole replica takes (``bytes_per_block`` is this rank's share; every
        tensor-parallel rank holds an equal one): what a pull moves per block, and ``/load``'s figures."""
        return tp_size * self.bytes_per_block

    @property
    def block_pitch(self) -> int:
        """Bytes from one block to the next within a region."""
        return self.block_step or self.block_stride

    def mismatch(self, other: KVBlockLayout) -> list[str]:
        """The fields that differ from ``other``'s as ``"name: mine vs theirs"`` (empty: compatible)."""
        return [f"{name}: {getattr(self, name)} vs {getattr(other, name)}" for name in MATCHING_FIELDS
                if getattr(self, name) != getattr(other, name)]

    def descriptor_ids(self, block_ids: list[int]) -> list[int]:
        """Descriptor indices of ``block_ids``, region-major (each region's blocks together)."""
        n = self.num_blocks
        return [r * n + b for r in range(self.num_regions) for b in block_ids]

    def descriptors(self, device_id: int = 0) -> list[tuple[int, int, int]]:
        """``(address, length, device_id)`` of every (region, block), in ``descriptor_ids`` order."""
        return [(self.base_address + r * self.region_stride + b * self.block_pitch, self.block_stride, device_id)
                for r in range(self.num_regions) for b in range(self.num_blocks)]

    def check_block_ids(self, block_ids: list[int], side: str) -> None:
        """A clear error for ids outside this cache (block 0 is the null block and never moves)."""
        bad = [b for b in block_ids if not 0 < b < self.num_blocks]
        if bad:
            raise ValueError(f"{side} block ids {bad[:8]} are outside 1..{self.num_blocks - 1} "
                             f"(the {side} cache has {self.num_blocks} blocks; block 0 is the null block)")


def block_layout(kv_cache: torch.Tensor, kv_layout: str, block_size: int, num_kv_heads: int,
                 head_dim: int, scales_digest: str = "") -> KVBlockLayout:
    """The layout of ``kv_cache`` ([num_layers, *layer_shape], contiguous) in the backend layout ``kv_layout``
    (``symbolic_layout``), quantized through the scales digested as ``scales_digest`` (FP8; empty: none)."""
    if not kv_cache.is_contiguous():
        raise ValueError("the KV cache must be one contiguous tensor to be registered for transfer")
    block_dim = block_dim_of(kv_layout)
    element = kv_cache.element_size()
    shape = kv_cache.shape
    num_regions = math.prod(shape[:block_dim])
    block_stride = kv_cache.stride(block_dim) * element
    return KVBlockLayout(
        num_layers=shape[0], block_size=block_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
        dtype=str(kv_cache.dtype).removeprefix("torch."), kv_layout=kv_layout, num_blocks=shape[block_dim],
        block_dim=block_dim, num_regions=num_regions, region_stride=shape[block_dim] * block_stride,
        block_stride=block_stride, bytes_per_block=num_regions * block_stride, base_address=kv_cache.data_ptr(),
        scales_digest=scales_digest)


# Distinct primes standing for each size, so a backend's shape function names its own dimensions.
_SYMBOLS = {1_000_003: "blocks", 1_000_033: "B", 1_000_037: "H", 1_000_039: "D"}


def symbolic_layout(kv_cache_shape) -> str:
    """A backend's cache layout by name, ``"L,2,H,blocks,B,D"`` for torch's: ``kv_cache_shape`` (the
    backend's ``(num_blocks, block_size, num_kv_heads, head_dim) -> layer shape``) called with stand-ins."""
    shape = kv_cache_shape(*_SYMBOLS)
    return ",".join(["L", *(_SYMBOLS.get(n, str(n)) for n in shape)])


def block_dim_of(kv_layout: str) -> int:
    """Index of the block dimension in a ``symbolic_layout`` name."""
    return kv_layout.split(",").index("blocks")


def host_tier_layout(device: KVBlockLayout, host: torch.Tensor) -> KVBlockLayout:
    """The layout of a host tier ``host`` ([num_host_blocks, *one device block], replica/worker/kv_offload.py) of
    a device cache laid out as ``device``: the same regions, each block whole."""
    return msgspec.structs.replace(device, num_blocks=host.shape[0], region_stride=device.block_stride,
                                   block_step=device.bytes_per_block, base_address=host.data_ptr())
