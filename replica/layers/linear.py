"""Tensor-parallel linear layers with per-parameter ``weight_loader`` (nano-vllm's shape).

Column-parallel layers split the *output* features over ranks (each rank holds rows
``[tp_rank * out/tp, (tp_rank + 1) * out/tp)`` of the weight); row-parallel layers split the
*input* features and all-reduce their partial products. A checkpoint tensor reaches a loader
either as a torch tensor or as a safetensors slice: ``narrow`` reads only this rank's part.

    QKVParallelLinear weight on rank r (rows):  [ q heads of r | k heads of r | v heads of r ]
    MergedColumnParallelLinear (gate_up):       [ gate rows of r | up rows of r ]
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from kvmesh.replica.distributed.parallel_state import SINGLE, ParallelState, divide
from torch import nn


class SafetensorsSlice(Protocol):
    """A checkpoint tensor not read yet (safetensors' ``PySafeSlice``): indexing reads only that part."""

    def get_shape(self) -> list[int]: ...

    def __getitem__(self, index: slice | tuple[slice, ...]) -> torch.Tensor: ...


LoadedWeight = torch.Tensor | SafetensorsSlice
"""A checkpoint tensor as a ``weight_loader`` receives it: in memory, or a slice read part by part."""

ShardId = int | str | None
"""Which part of a fused parameter a checkpoint tensor fills: gate/up's index, ``"q"``/``"k"``/``"v"``, or None."""


def loaded_shape(w: LoadedWeight) -> tuple[int, ...]:
    """Shape of a checkpoint tensor or safetensors slice."""
    return tuple(w.shape) if isinstance(w, torch.Tensor) else tuple(w.get_shape())


def narrow(w: LoadedWeight, dim: int, start: int, size: int) -> torch.Tensor:
    """``w[start:start+size]`` along ``dim``, reading only that part of a safetensors slice."""
    if isinstance(w, torch.Tensor):
        return w.narrow(dim, start, size)
    index = [slice(None)] * len(w.get_shape())
    index[dim] = slice(start, start + size)
    return w[tuple(index)]


def materialize(w: LoadedWeight) -> torch.Tensor:
    """The whole checkpoint tensor."""
    return w if isinstance(w, torch.Tensor) else w[:]


def default_weight_loader(param: nn.Parameter, loaded: LoadedWeight) -> None:
    """Copy an unsharded tensor (casting to the parameter's dtype/device)."""
    w = materialize(loaded)
    if tuple(w.shape) != tuple(param.shape):
        raise ValueError(f"checkpoint tensor has shape {tuple(w.shape)}, parameter expects {tuple(param.shape)}")
    param.data.copy_(w)


class LinearBase(nn.Module):
    """y = x W^T (+ b) with W stored as this rank's shard; ``tp_dim`` is the split dimension of W."""

    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None,
                 parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        self.parallel = parallel
        self.tp_rank, self.tp_size, self.tp_dim = parallel.tp_rank, parallel.tp_size, tp_dim
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)  # [out, in]
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)  # [out]
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: LoadedWeight, shard_id: ShardId = None) -> None:
        raise NotImplementedError


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; the output stays sharded (no communication)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, parallel: ParallelState = SINGLE):
        super().__init__(input_size, divide(output_size, parallel.tp_size, "output_size"), bias, 0, parallel)

    def weight_loader(self, param: nn.Parameter, loaded: LoadedWeight, shard_id: ShardId = None) -> None:
        size = param.shape[0]
        param.data.copy_(narrow(loaded, 0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input fused into one matmul (gate_up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 parallel: ParallelState = SINGLE) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, parallel)

    def weight_loader(self, param: nn.Parameter, loaded: LoadedWeight, shard_id: int = 0) -> None:
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused; heads split over ranks (K/V heads replicated when fewer than ranks)."""

    def __init__(self, hidden_size: int, head_dim: int, total_num_heads: int, total_num_kv_heads: int,
                 bias: bool = False, parallel: ParallelState = SINGLE) -> None:
        tp = parallel.tp_size
        self.head_dim = head_dim
        self.num_heads = divide(total_num_heads, tp, "num_attention_heads")
        if total_num_kv_heads >= tp:
            self.num_kv_heads = divide(total_num_kv_heads, tp, "num_key_value_heads")
            self.kv_head_start = parallel.tp_rank * self.num_kv_heads
        else:  # each K/V head lives on tp / total_num_kv_heads ranks
            divide(tp, total_num_kv_heads, "tensor_parallel_size over num_key_value_heads")
            self.num_kv_heads = 1
            self.kv_head_start = parallel.tp_rank // (tp // total_num_kv_heads)
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out, bias, parallel)

    def weight_loader(self, param: nn.Parameter, loaded: LoadedWeight, shard_id: str = "q") -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, start = 0, q_size, self.tp_rank * q_size
        elif shard_id == "k":
            offset, size, start = q_size, kv_size, self.kv_head_start * self.head_dim
        elif shard_id == "v":
            offset, size, start = q_size + kv_size, kv_size, self.kv_head_start * self.head_dim
        else:
            raise ValueError(f"QKV shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, start, size))


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial outputs are summed with an all-reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, parallel: ParallelState = SINGLE):
        super().__init__(divide(input_size, parallel.tp_size, "input_size"), output_size, bias, 1, parallel)

    def weight_loader(self, param: nn.Parameter, loaded: LoadedWeight, shard_id: ShardId = None) -> None:
        if param.dim() == 1:  # the bias is not split; only rank 0 adds it
            default_weight_loader(param, loaded)
            return
        size = param.shape[1]
        param.data.copy_(narrow(loaded, 1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        return self.parallel.all_reduce(y)
