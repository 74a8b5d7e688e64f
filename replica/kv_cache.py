"""The paged KV cache: one preallocated tensor for all layers, sized from a memory budget.

    kv_cache: [num_layers, *backend.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)]
      torch:      [num_layers, 2, num_kv_heads, num_blocks, block_size, head_dim]   (head-major)
      flash_attn, triton: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]   (flash-attn's paged layout)
                               ^ 0 = K, 1 = V                ^ this rank's K/V heads
    layer l's view kv_cache[l] is what its attention backend reads and writes;
    token at position p of a request lives at slot block_table[p // block_size] * block_size
    + p % block_size. Block 0 is the null block: never allocated to a request, it pads block tables.

On CPU the budget is ``kv_cache_memory`` bytes for the whole replica (all TP ranks together, so a
TP=2 replica gets as many blocks as a TP=1 one). On CUDA it is what ``gpu_memory_utilization``
leaves after the weights and the peak activation memory of a profiling forward: the device facts
are read once (``read_cuda_memory``) and the arithmetic (``kv_cache_budget``) is plain, so it is
tested on CPU with facts injected.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one block takes on this rank (K and V, all layers)."""
    return num_layers * 2 * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def num_blocks_for_budget(budget_bytes: int, block_bytes: int, block_size: int, max_model_len: int) -> int:
    """How many blocks (null block included) fit; raises when not even one full-length sequence fits."""
    num_blocks = budget_bytes // block_bytes
    needed = -(-max_model_len // block_size) + 1
    if num_blocks < 2:
        raise ValueError(
            f"KV cache budget of {budget_bytes} bytes holds {num_blocks} blocks of {block_bytes} bytes; "
            "raise kv_cache_memory / gpu_memory_utilization or lower max_model_len"
        )
    if num_blocks < needed:
        logger.warning("KV cache holds %d blocks, fewer than the %d one %d-token sequence needs",
                       num_blocks, needed, max_model_len)
    return num_blocks


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What a device's memory looked like right after the profiling forward (bytes)."""

    total: int
    """The device's memory (torch.cuda.mem_get_info's total)."""
    free: int
    """Free to anyone (mem_get_info's free)."""
    torch_peak: int
    """Peak bytes this process's tensors held: weights + the profiling forward's activations."""
    torch_reserved: int
    """Bytes PyTorch's caching allocator holds now (counted in total - free)."""
    in_use_at_start: int = 0
    """Bytes in use on the device before this runner loaded anything: other replicas sharing the card."""

    @property
    def non_torch(self) -> int:
        """Used since this runner started, not by its allocator: the CUDA context, NCCL (what others held at
        the start is theirs: gpu_memory_utilization is this replica's share, vLLM's per-instance meaning)."""
        return max(0, self.total - self.free - self.torch_reserved - self.in_use_at_start)


def read_cuda_memory(device: torch.device) -> DeviceMemory:
    """The facts ``kv_cache_budget`` needs, read from CUDA (call right after the profiling forward)."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(total, free, torch.cuda.max_memory_allocated(device), torch.cuda.memory_reserved(device))


def device_memory_in_use(device: torch.device) -> int:
    """Bytes in use on ``device`` by anyone now (0 off CUDA): read before a runner loads its weights."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def kv_cache_budget(mem: DeviceMemory, gpu_memory_utilization: float) -> int:
    """Bytes for the KV cache: the replica's share of the device, less the profiled peak and its other use.

        budget = total * gpu_memory_utilization - torch_peak - non_torch
    """
    gib = 2**30
    share = mem.total * gpu_memory_utilization
    if mem.in_use_at_start and mem.total - mem.in_use_at_start < share:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} asks for {share / gib:.1f} of the device's "
            f"{mem.total / gib:.1f} GiB, but {mem.in_use_at_start / gib:.1f} GiB were in use when this replica "
            "started (other replicas or programs on the card); lower gpu_memory_utilization (with several "
            "replicas per GPU: replicas.gpus_per_replica, whose share serve applies) or free the device")
    budget = int(mem.total * gpu_memory_utilization - mem.torch_peak - mem.non_torch)
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} of {mem.total / gib:.1f} GiB leaves no room for the KV "
            f"cache: weights + activations peak at {mem.torch_peak / gib:.1f} GiB and {mem.non_torch / gib:.1f} GiB "
            "are used outside this process's tensors; raise gpu_memory_utilization or lower max_num_batched_tokens")
    return budget


def allocate_kv_cache(num_layers: int, layer_shape: tuple[int, ...], dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """The zeroed cache tensor [num_layers, *layer_shape] (zeros: padded slots are read masked, and must
    not hold NaN)."""
    return torch.zeros(num_layers, *layer_shape, dtype=dtype, device=device)


def log_capacity(num_blocks: int, block_size: int, max_model_len: int, block_bytes: int) -> None:
    tokens = (num_blocks - 1) * block_size
    logger.info("KV cache: %d blocks x %d tokens (%.1f MiB), %d tokens; max concurrency %.2fx at %d tokens/request",
                num_blocks, block_size, num_blocks * block_bytes / 2**20, tokens, tokens / max_model_len,
                max_model_len)
