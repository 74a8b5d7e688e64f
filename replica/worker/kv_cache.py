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
leaves after this engine's weights, the peak activation memory of a profiling forward and the
memory its decode CUDA graphs take (measured by capturing them once before the cache is sized,
``graph_memory``), capped by ``kv_cache_memory`` when that is set. Only this engine's memory counts against its share,
so
several engines in one process (tests, a benchmark comparing two) each get their own share as
long as the shares fit on the device. The device facts are read before and after the profiling
forward (``read_cuda_memory``) and the arithmetic (``kv_cache_budget``) is plain, so it is tested
on CPU with facts injected.
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
    """What a device's memory looks like at one moment (bytes)."""

    total: int
    """The device's memory (torch.cuda.mem_get_info's total)."""
    free: int
    """Free to anyone (mem_get_info's free)."""
    torch_peak: int
    """Peak bytes this process's tensors held since the peak counter was last reset."""
    torch_reserved: int
    """Bytes PyTorch's caching allocator holds now (counted in total - free)."""
    torch_allocated: int
    """Bytes this process's tensors hold now (torch.cuda.memory_allocated)."""

    @property
    def non_torch(self) -> int:
        """Used but not by this process's allocator: the CUDA context, NCCL, other processes (other replicas
        sharing the card: ``kv_cache_budget`` takes off what they held when this runner started)."""
        return self.total - self.free - self.torch_reserved


def read_cuda_memory(device: torch.device) -> DeviceMemory:
    """The facts ``kv_cache_budget`` needs, read from CUDA (before and right after the profiling forward)."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(total, free, torch.cuda.max_memory_allocated(device), torch.cuda.memory_reserved(device),
                        torch.cuda.memory_allocated(device))


def outside_memory_in_use(device: torch.device) -> int:
    """Bytes in use on ``device`` outside this process's tensors now (0 off CUDA): read before a runner loads
    its weights, it is what other replicas sharing the card (other processes) already hold."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return max(0, total - free - torch.cuda.memory_reserved(device))


def graph_memory(before: DeviceMemory, after: DeviceMemory) -> int:
    """Device bytes a capture took: ``before``/``after`` are read around capturing every decode graph (their
    memory pool, inside torch's allocator, and the instantiated graphs, outside it: both leave ``free``)."""
    return max(0, before.free - after.free)


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (an engine's weights)."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def kv_cache_budget(before: DeviceMemory, after: DeviceMemory, weight_bytes: int, gpu_memory_utilization: float,
                    cap: int | None = None, outside_at_start: int = 0, graphs: int = 0) -> int:
    """Bytes for this engine's KV cache: its share of the device less what it uses, capped by ``cap``
    (``kv_cache_memory``); ``before``/``after`` are read around the profiling forward, ``weight_bytes``
    are this engine's weights, ``outside_at_start`` what was in use outside this process before the
    runner loaded anything (``outside_memory_in_use``: other replicas sharing the card), ``graphs`` what its
    decode CUDA graphs take (``graph_memory``; 0 without graphs).

        activations = after.torch_peak - before.torch_allocated     (the forward's peak above what was held)
        outside     = after.non_torch - outside_at_start            (this process's CUDA context, NCCL, ...)
        budget      = total * gpu_memory_utilization - weight_bytes - activations - outside - graphs

    Neither other engines in this process (``before.torch_allocated - weight_bytes``) nor other
    processes' memory at start count against this engine's share, but the budget must fit in what is
    free once the activations are allocated again; when it does not, the shares overcommit the device
    and that is an error.
    """
    gib = 2**30
    share = after.total * gpu_memory_utilization
    if outside_at_start and after.total - outside_at_start < share:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} asks for {share / gib:.1f} of the device's "
            f"{after.total / gib:.1f} GiB, but {outside_at_start / gib:.1f} GiB were in use when this replica "
            "started (other replicas or programs on the card); lower gpu_memory_utilization (with several "
            "replicas per GPU: replicas.gpus_per_replica, whose share serve applies) or free the device")
    activations = max(0, after.torch_peak - before.torch_allocated)
    others = max(0, before.torch_allocated - weight_bytes)
    outside = max(0, after.non_torch - outside_at_start)
    budget = int(share - weight_bytes - activations - outside - graphs)
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} of {after.total / gib:.1f} GiB leaves no room for the "
            f"KV cache: weights + activations peak at {(weight_bytes + activations) / gib:.1f} GiB, the decode "
            f"CUDA graphs take {graphs / gib:.1f} GiB and {outside / gib:.1f} GiB are used outside this process's "
            "tensors; raise gpu_memory_utilization, lower max_num_batched_tokens or max_num_seqs (fewer graphs), "
            "or set cuda_graphs=False")
    if cap is not None:
        budget = min(budget, cap)
    room = after.free + after.torch_reserved - after.torch_allocated - activations - graphs
    if budget > room:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} asks for a {budget / gib:.1f} GiB KV cache but only "
            f"{max(room, 0) / gib:.1f} GiB of the {after.total / gib:.1f} GiB device are free ({others / gib:.1f} GiB "
            f"held by other engines in this process, {after.non_torch / gib:.1f} GiB outside it); the engines on "
            "one device must share it: lower gpu_memory_utilization or set kv_cache_memory")
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
