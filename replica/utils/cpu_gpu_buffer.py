"""Host staging buffers with device twins, for the step's inputs (vLLM's ``CpuGpuBuffer``).

    host:   pinned CPU tensor [size] (a numpy view ``np`` is what the input code writes)
               │  copy_to_gpu(n): one non-blocking cudaMemcpyAsync of the first n entries
               ▼
    device: persistent tensor [size] on the runner's device (same addresses every step)

Allocated once at the largest size a step needs, so a step allocates nothing and the host never
blocks on a copy from pageable memory (which makes ``cudaMemcpyAsync`` synchronous). Pinned only
when CUDA is available. On a CPU device host and device are one tensor: no copy at all.

A non-blocking copy reads the pinned memory later, when the stream reaches it: the host must not
overwrite the buffer before then. ``CopyFence`` is the CUDA event the runner waits on before it
writes the next step's inputs (a step that samples waits anyway, for its sampled ids).
"""

from __future__ import annotations

import numpy as np
import torch


class CpuGpuBuffer:
    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self._allocate(size)

    def _allocate(self, size: int) -> None:
        pin = self.device.type == "cuda" and torch.cuda.is_available()
        self.cpu = torch.zeros(size, dtype=self.dtype, pin_memory=pin)  # [size] host staging
        self.np = self.cpu.numpy()
        # [size] on the device; the host tensor itself on a CPU device
        self.gpu = self.cpu if self.device.type == "cpu" else torch.zeros(size, dtype=self.dtype, device=self.device)

    def fit(self, size: int) -> None:
        """Grow (reallocate) to hold ``size`` entries; the runner sizes buffers so that steps never need it."""
        if size > self.cpu.shape[0]:
            self._allocate(max(size, 2 * self.cpu.shape[0]))

    def copy_to_gpu(self, n: int) -> torch.Tensor:
        """The first ``n`` entries on the device (enqueued, not waited for)."""
        if self.gpu is self.cpu:
            return self.cpu[:n]
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list/array on ``device`` without blocking the host: staged through pinned memory on
    CUDA (PyTorch's caching host allocator keeps the block until the copy has run)."""
    t = torch.as_tensor(values, dtype=dtype)
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


class PackedUpload:
    """Small host arrays packed into one staging buffer and copied to its device twin in one upload:

        host bytes:  [ array 0 | array 1 | ... ]   each at an 8-byte aligned offset  --one copy-->  device bytes
        each tensor handed out is a typed view of the device bytes, shaped like its array

    Allocated once (grown, reallocated, only when a call outgrows it). A call waits until the previous
    call's copy has read the staging buffer before writing it (``CopyFence``)."""

    ALIGN = 8  # bytes: every view's offset is a multiple of its element size

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.arena = CpuGpuBuffer(nbytes + 8 * self.ALIGN, torch.uint8, device)
        self.fence = CopyFence(device)

    def upload(self, arrays: list[tuple]) -> list[torch.Tensor]:
        """``(array, numpy dtype)`` pairs -> their device tensors, after one non-blocking copy."""
        arrays = [np.ascontiguousarray(a, dtype) for a, dtype in arrays]
        offsets, end = [], 0
        for a in arrays:
            start = -(-end // self.ALIGN) * self.ALIGN
            offsets.append(start)
            end = start + a.nbytes
        self.fence.wait()
        arena = self.arena
        arena.fit(end)
        for a, start in zip(arrays, offsets, strict=True):
            arena.np[start: start + a.nbytes] = a.reshape(-1).view(np.uint8)
        device = arena.copy_to_gpu(end)  # [end] bytes on the device
        self.fence.record()
        return [device[start: start + a.nbytes].view(_TORCH_DTYPES[a.dtype]).view(a.shape)
                for a, start in zip(arrays, offsets, strict=True)]


_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                 np.dtype(np.float32): torch.float32, np.dtype(np.bool_): torch.bool}


class HostCopies:
    """Where sampled ids land on the host: ``depth`` pinned buffers [capacity] and CUDA events, allocated
    once and used in turn, so a step allocates nothing for its copy back.

        step N -> slot N % depth:  tokens (device) --non-blocking copy--> pinned[slot][:n], event[slot]

    A slot is reused ``depth`` steps later. The engine reads step N's tokens right after launching step
    N + 1 (async scheduling), so two slots are in use at most; ``depth`` 3 leaves one spare."""

    def __init__(self, capacity: int, dtype: torch.dtype, device: torch.device, depth: int = 3) -> None:
        self.device, self.next = device, 0
        self.host = None if device.type == "cpu" else torch.zeros(
            depth, capacity, dtype=dtype, pin_memory=device.type == "cuda")  # [depth, capacity]
        self.events = [torch.cuda.Event() for _ in range(depth)] if device.type == "cuda" else None

    def start(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Enqueue ``t``'s copy to the host without waiting; returns the host tensor and the event to wait on
        before reading it (None: already there)."""
        if self.host is None:
            return t, None
        slot, self.next = self.next, (self.next + 1) % self.host.shape[0]
        assert t.numel() <= self.host.shape[1], f"{t.numel()} sampled ids; the host buffers hold {self.host.shape[1]}"
        host = self.host[slot, : t.numel()].view(t.shape)
        host.copy_(t, non_blocking=True)
        if self.events is None:
            return host, None
        self.events[slot].record()
        return host, self.events[slot]


class CopyFence:
    """Marks where the last step's host-to-device copies were enqueued (a CUDA event; a no-op elsewhere)."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event() if device.type == "cuda" else None
        self.pending = False

    def record(self) -> None:
        if self.event is not None:
            self.event.record()
            self.pending = True

    def wait(self) -> None:
        """Block the host until the recorded copies have read their pinned sources."""
        if self.pending:
            self.event.synchronize()
            self.pending = False
