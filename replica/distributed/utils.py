"""torch.distributed set-up for one tensor-parallel group (NCCL on CUDA, gloo on CPU).

Every collective has a timeout, so a rank that dies or hangs makes the others fail with an error
instead of waiting forever; the replica then goes down cleanly and Ray restarts it.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0
"""How long a rank waits in a collective (all_reduce, ...) before giving up."""


@dataclass(frozen=True, slots=True)
class DistributedInit:
    """Where the ranks of one group meet (rank 0's address) and how they talk."""

    master_addr: str
    """IP of rank 0's node."""
    master_port: int
    """A free TCP port on rank 0's node (the rendezvous store)."""
    world_size: int
    """Ranks in the group (= tensor_parallel_size)."""
    backend: str = "gloo"
    """"nccl" on CUDA, "gloo" on CPU."""
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Collective and rendezvous timeout in seconds."""

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


def backend_for(device: str) -> str:
    return "nccl" if str(device).startswith("cuda") else "gloo"


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago on this node (the rendezvous port of rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cuda_device_index(rank: int, visible_devices: int) -> int:
    """The CUDA device a TP rank uses. Under Ray each rank's actor sees exactly its own GPU (index 0);
    a process that sees several GPUs (one node, no Ray) takes the rank-th, and two ranks never share one."""
    if visible_devices < 1:
        raise ValueError("this process sees no CUDA device (CUDA_VISIBLE_DEVICES empty?); a GPU rank needs one")
    if visible_devices == 1:
        return 0
    if rank >= visible_devices:
        raise ValueError(f"TP rank {rank} sees {visible_devices} CUDA devices; a rank needs a GPU of its own: "
                         "lower tensor_parallel_size or run one rank per GPU (Ray does)")
    return rank


def process_group_args(init: DistributedInit, rank: int) -> dict:
    """The keyword arguments of ``torch.distributed.init_process_group`` for ``rank``."""
    if not 0 <= rank < init.world_size:
        raise ValueError(f"rank {rank} is outside the group of {init.world_size}")
    host = f"[{init.master_addr}]" if ":" in init.master_addr else init.master_addr  # IPv6 in a URL
    return dict(backend=init.backend, init_method=f"tcp://{host}:{init.master_port}", world_size=init.world_size,
                rank=rank, timeout=datetime.timedelta(seconds=init.timeout_s))


def init_distributed(init: DistributedInit, rank: int) -> None:
    """Join the process group as ``rank`` (blocks until every rank has joined or the timeout)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process; one TP group per worker")
    args = process_group_args(init, rank)
    if init.backend == "nccl":  # NCCL binds to the current device: the one this rank's model uses
        import torch

        torch.cuda.set_device(cuda_device_index(rank, torch.cuda.device_count()))
    dist.init_process_group(**args)


def destroy_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
