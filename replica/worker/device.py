"""The runner's device: which one a rank takes, the thread that makes it current, CPU threads.

The current CUDA device is per thread: the thread that builds a runner (``pick_device``) and the one that
steps it (the engine thread: ``ModelRunner.bind_thread``) each make it current, so a rank on GPU 1 never
launches on GPU 0.
"""

from __future__ import annotations

import os

import torch
from kvmesh.replica.distributed.utils import cuda_device_index

SMALL_MODEL_HIDDEN = 256  # below this hidden size the CPU forward runs single-threaded


def pick_device(device: str | None, rank: int) -> torch.device:
    """The runner's device: ``device`` (None: CUDA when there is one), for CUDA this rank's GPU, made current."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device; use device='cpu'")
        dev = torch.device("cuda", cuda_device_index(rank, torch.cuda.device_count()))
        set_current_device(dev)  # NCCL collectives and .cuda() use the current device
        return dev
    return torch.device(device)


def set_current_device(device: torch.device) -> None:
    """Make ``device`` the calling thread's current CUDA device (nothing off CUDA)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def set_num_threads(device: torch.device, world_size: int, hidden_size: int) -> None:
    """On CPU use this process's share of the cores (TP ranks share a machine), unless OMP_NUM_THREADS
    or KVMESH_NUM_THREADS is set. Tiny models run on one thread: their ops are too small to split, and
    idle OpenMP workers spinning on a busy machine cost more than they give."""
    if device.type != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = 1 if hidden_size < SMALL_MODEL_HIDDEN else max(1, cores // world_size)
    torch.set_num_threads(int(os.environ.get("KVMESH_NUM_THREADS", threads)))
