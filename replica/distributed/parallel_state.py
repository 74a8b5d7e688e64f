"""Who this process is inside its tensor-parallel group, and the collectives layers use.

Layers receive a ``ParallelState`` explicitly (no process-wide global), so tests can build the
shards of every rank in one process and check the sharding arithmetic by summing slices.
When ``tp_size > 1`` the replica engineer has already run ``torch.distributed.init_process_group``
(gloo on CPU, NCCL on GPU); ``group`` may name a sub-group, None means the default group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class ParallelState:
    """Tensor-parallel coordinates of one rank."""

    tp_rank: int = 0
    """This rank's index in the tensor-parallel group, in [0, tp_size)."""
    tp_size: int = 1
    """Number of ranks the model is sharded over."""
    group: dist.ProcessGroup | None = None
    """torch.distributed process group of the TP ranks (None = the default group)."""

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"need 0 <= tp_rank < tp_size, got tp_rank={self.tp_rank} tp_size={self.tp_size}")

    @property
    def is_distributed(self) -> bool:
        """True when collectives must run (more than one rank)."""
        return self.tp_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the TP ranks in place (identity with one rank)."""
        if self.is_distributed:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dimension (rank order)."""
        if not self.is_distributed:
            return x
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def all_reduce_min_int(self, value: int) -> int:
        """The smallest ``value`` over the TP ranks (every rank must size its KV cache alike)."""
        if not self.is_distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        if dist.get_backend(self.group) == "nccl":
            t = t.cuda()
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())


SINGLE = ParallelState()
"""The state of an unsharded model."""


def divide(numerator: int, denominator: int, what: str = "value") -> int:
    """``numerator / denominator``, which must be exact (e.g. heads over TP ranks)."""
    if numerator % denominator:
        raise ValueError(
            f"{what}={numerator} is not divisible by tensor_parallel_size={denominator}; "
            "pick a tensor_parallel_size that divides it"
        )
    return numerator // denominator
