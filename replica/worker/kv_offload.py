"""The runner's half of the host tier (vLLM's ``CpuGpuOffloadingHandler``): the copies themselves.

The KV cache manager decides which blocks move (kvcache/offload.py); this file moves them between
the device cache and a host tensor of the same per-block layout::

    device cache  [num_layers, *layer_shape]   blocks along ``block_dim`` (the backend's layout)
    host tier     [num_host_blocks, *block]    one contiguous block per row, pinned on CUDA

Written for CUDA first, and the same code runs on CPU (no streams, copies done at once):

- every copy runs on one side stream, after the compute stream's work so far (``wait_stream``): a
  load never overwrites a block the previous step still touches, a store reads what the forward wrote;
- loads (before the forward): the compute stream waits for them, so a prefill reads its prefix;
- stores (after the forward): an event per step, polled without blocking (``finished``); until it
  fires the engine holds the device block, so nothing overwrites what is being read;
- loads and stores share the stream, so a host block is rewritten only after earlier loads read it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

import torch
from kvmesh.replica.attention.kv_quant import is_fp8

if TYPE_CHECKING:
    from kvmesh.replica.kv_layout import KVBlockLayout

logger = logging.getLogger(__name__)


def _runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """Pairs ``(src, dst)`` grouped into ``(i, src0, dst0, n)`` runs where both ids rise by one."""
    runs: list[tuple[int, int, int, int]] = []
    for i, (src, dst) in enumerate(pairs):
        if runs and (last := runs[-1]) and src == last[1] + last[3] and dst == last[2] + last[3]:
            runs[-1] = (last[0], last[1], last[2], last[3] + 1)
        else:
            runs.append((i, src, dst, 1))
    return runs


class KVOffloader:
    """Copies blocks between ``kv_cache`` (laid out as ``layout``, the runner's one ``KVBlockLayout``) and a host
    tier of ``num_host_blocks``; see the module doc."""

    def __init__(self, kv_cache: torch.Tensor, layout: KVBlockLayout, num_host_blocks: int) -> None:
        self.kv_cache = kv_cache
        self.block_dim = block_dim = layout.block_dim
        self.device = kv_cache.device
        self.cuda = self.device.type == "cuda"
        self.block_shape = tuple(kv_cache.select(block_dim, 0).shape)
        self.block_bytes = layout.bytes_per_block
        # [num_host_blocks, *block_shape]; row 0 mirrors the device's null block and is never used
        self.host = torch.zeros((num_host_blocks, *self.block_shape), dtype=kv_cache.dtype,
                                pin_memory=self.cuda)
        # what the copies index: an FP8 cache as its bytes (index_copy_/index_select take no FP8 on CPU)
        self._device_view, self._host_view = (t.view(torch.uint8) if is_fp8(t.dtype) else t for t in (kv_cache,
                                                                                                      self.host))
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._pending: list[tuple[int, torch.cuda.Event | None]] = []
        self.bytes_loaded = 0
        """Bytes copied host -> device so far."""
        self.bytes_stored = 0
        """Bytes copied device -> host so far."""
        self.load_seconds = 0.0
        """Time spent loading so far (measured on CPU; on CUDA bytes over the measured bandwidth)."""
        self.h2d_bytes_per_s = self._measure_h2d()
        """Host-to-device bandwidth this replica measured at start (bytes/s); the router prices load-backs with it."""

    @property
    def num_host_blocks(self) -> int:
        return self.host.shape[0]

    def _on_side_stream(self):
        if self.stream is None:
            return contextlib.nullcontext()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.stream)

    def _ids(self, ids: list[int]) -> torch.Tensor:
        t = torch.tensor(ids, dtype=torch.int64, pin_memory=self.cuda)
        return t.to(self.device, non_blocking=True)

    def load(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host blocks into device blocks, ``(host_id, device_id)``, before the next forward."""
        if not pairs:
            return
        start = time.perf_counter()
        with self._on_side_stream():
            # [n, *block_shape]
            staging = torch.empty((len(pairs), *self.block_shape), dtype=self._device_view.dtype, device=self.device)
            for i, h0, _, n in _runs(pairs):
                staging[i:i + n].copy_(self._host_view[h0:h0 + n], non_blocking=True)
            dev_ids = self._ids([d for _, d in pairs])
            self._device_view.index_copy_(self.block_dim, dev_ids, staging.movedim(0, self.block_dim))
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)  # the prefill reads its prefix
        nbytes = len(pairs) * self.block_bytes
        self.bytes_loaded += nbytes
        self.load_seconds += nbytes / self.h2d_bytes_per_s if self.cuda else time.perf_counter() - start

    def store(self, job_id: int, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks into host blocks, ``(device_id, host_id)``, after the step's forward."""
        if not pairs:
            return
        with self._on_side_stream():
            dev_ids = self._ids([d for d, _ in pairs])
            # [n, *block_shape]
            staging = self._device_view.index_select(self.block_dim, dev_ids).movedim(self.block_dim, 0).contiguous()
            for i, _, h0, n in _runs(pairs):
                self._host_view[h0:h0 + n].copy_(staging[i:i + n], non_blocking=True)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        self._pending.append((job_id, event))
        self.bytes_stored += len(pairs) * self.block_bytes

    def finished(self) -> list[int]:
        """Job ids whose stores landed since the last call (never blocks; in issue order)."""
        done: list[int] = []
        while self._pending and (self._pending[0][1] is None or self._pending[0][1].query()):
            done.append(self._pending.pop(0)[0])
        return done

    def _measure_h2d(self) -> float:
        """Host-to-device bytes/s over up to 64 blocks (at least 1 MiB when the tier holds it)."""
        n = max(1, min(self.num_host_blocks, max(64, (1 << 20) // max(1, self.block_bytes))))
        scratch = torch.empty((n, *self.block_shape), dtype=self.kv_cache.dtype, device=self.device)
        scratch.copy_(self.host[:n], non_blocking=self.cuda)  # warm-up
        if self.cuda:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        scratch.copy_(self.host[:n], non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return n * self.block_bytes / max(time.perf_counter() - start, 1e-9)


def make_kv_offload(kv_offload_memory: int | None, kv_cache: torch.Tensor, layout: KVBlockLayout) -> KVOffloader | None:
    """The host tier of ``kv_offload_memory`` bytes, laid out per block like the device cache (None: no tier)."""
    if not kv_offload_memory:
        return None
    block_bytes = layout.bytes_per_block
    num_host_blocks = kv_offload_memory // block_bytes
    if num_host_blocks < 2:
        raise ValueError(f"kv_offload_memory={kv_offload_memory} bytes holds {num_host_blocks} "
                         f"blocks of {block_bytes} bytes; give the host tier at least 2 blocks or unset it")
    offload = KVOffloader(kv_cache, layout, num_host_blocks)
    logger.info("host KV tier: %d blocks (%.1f MiB), host-to-device %.2f GB/s", num_host_blocks,
                num_host_blocks * block_bytes / 2**20, offload.h2d_bytes_per_s / 1e9)
    return offload
