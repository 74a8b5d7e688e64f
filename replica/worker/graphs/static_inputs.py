"""The decode graphs' inputs, where the step's one upload lands (no copy between the upload and the replay).

One host staging buffer (pinned on CUDA) and its device twin, allocated once, at fixed offsets:

    int64 [7, B_max]:    input_ids | positions | slot_mapping | gather src | gather dst | top_k | draw keys
    float32 [2, B_max]:  temperature | top_p              (the sampling graph's settings: fixed_sampler.py)
    int32 [B_max]:       seq_lens
    int32 [B_max, W]:    block_table                      (B_max: the largest capture size, W: blocks per request)

A decode-only step of n rows padded to a capture size b writes rows [0, b) of every array -- rows n..b-1
are padding: token 0 at position 0, writing and reading slot 0 (the null block, never a request's),
seq_len 1 -- and uploads bytes [0, end of block_table row b) in one non-blocking copy. The graphs are
captured over these device views, so a step's replay reads what it uploaded. Gather rows (async
scheduling: decode ids still on the device) ride in the same copy, and so do the rows' sampling settings
when the step samples inside the graph (padding rows: temperature 0, i.e. greedy).
"""

from __future__ import annotations

import numpy as np
import torch
from kvmesh.replica.utils.cpu_gpu_buffer import CopyFence, CpuGpuBuffer


class StaticInputs:
    def __init__(self, b_max: int, width: int, device: torch.device) -> None:
        self.b_max, self.width = b_max, width
        self.table_offset = 4 * (14 * b_max + 2 * b_max + b_max)  # bytes before the block table
        self.buffer = CpuGpuBuffer(self.table_offset + 4 * b_max * width, torch.uint8, device)
        self.fence = CopyFence(device)  # the previous upload has read the host buffer
        host64, host32, self.host_seq_lens, self.host_table = (t.numpy() for t in self._views(self.buffer.cpu))
        self.host_ids, self.host_positions, self.host_slots, self.host_src, self.host_dst, self.host_top_k, \
            self.host_keys = host64
        self.host_temperature, self.host_top_p = host32
        self.host_seq_lens[:] = 1
        self.host_top_k[:], self.host_top_p[:] = 1, 1.0
        if self.buffer.gpu is not self.buffer.cpu:
            self.buffer.gpu.copy_(self.buffer.cpu)  # the device twin starts as padding too
        dev64, dev32, self.seq_lens, self.block_table = self._views(self.buffer.gpu)
        self.input_ids, self.positions, self.slot_mapping, self.gather_src, self.gather_dst, self.top_k, \
            self.keys = dev64
        self.temperature, self.top_p = dev32

    def _views(self, arena: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = self.b_max
        i64 = arena[: 56 * b].view(torch.int64).view(7, b)  # [7, B_max]
        f32 = arena[56 * b: 64 * b].view(torch.float32).view(2, b)  # [2, B_max]
        i32 = arena[64 * b:].view(torch.int32)
        return i64, f32, i32[:b], i32[b:].view(b, self.width)  # [B_max], [B_max, W]

    def sampling(self, b: int) -> tuple[torch.Tensor, ...]:
        """The sampling graph's settings of b rows: temperature, top_k, top_p, draw keys (device views)."""
        return self.temperature[:b], self.top_k[:b], self.top_p[:b], self.keys[:b]

    def stage(self, b: int, input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
              seq_lens: np.ndarray, block_tables: np.ndarray, gather: list, sampling: tuple | None = None
              ) -> tuple[torch.Tensor, ...] | None:
        """Write a step of n = len(input_ids) rows padded to b and upload it; returns the gather's (src, dst)
        device views when there is one (None otherwise). ``sampling``: the rows' (temperature, top_k, top_p,
        draw keys) when the step samples inside the graph."""
        n, width = len(input_ids), block_tables.shape[1]
        self.fence.wait()
        for host, values in ((self.host_ids, input_ids), (self.host_positions, positions),
                             (self.host_slots, slot_mapping)):
            host[:n] = values
            host[n:b] = 0
        self.host_seq_lens[:n] = seq_lens
        self.host_seq_lens[n:b] = 1
        self.host_table[:n, :width] = block_tables
        self.host_table[:n, width:] = 0
        self.host_table[n:b] = 0
        if sampling is not None:
            for host, values, pad in zip((self.host_temperature, self.host_top_k, self.host_top_p, self.host_keys),
                                         sampling, (0.0, 1, 1.0, 0), strict=True):
                host[:n] = values
                host[n:b] = pad
        g = len(gather[0][0]) if gather else 0
        if g:
            self.host_src[:g], self.host_dst[:g] = gather[0][0], gather[1][0]
        self.buffer.copy_to_gpu(self.table_offset + 4 * b * self.width)
        self.fence.record()
        return (self.gather_src[:g], self.gather_dst[:g]) if g else None
