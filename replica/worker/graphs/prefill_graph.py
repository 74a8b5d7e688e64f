"""Short prefill steps on static shapes: the cached-prefix TTFT step as one CUDA-graph replay.

A step of one request that samples and whose query has Q <= 64 tokens (a short suffix over a cached
prefix, or a short prompt) is padded to a capture size P >= Q of ``PREFILL_SIZES`` and run on the buffers
of ``PrefillInputs``, whose addresses never change. The padding is a second, empty request over the null
block, so the attention launch's grid depends on P alone, never on host values:

    tokens           [ q0 q1 ... q(Q-1) | pad0 ... pad(P-Q-1) ]      request 0: the real one; 1: padding
    query_start_loc  [0, Q, P]              seq_lens [ctx + Q, P - Q]      cu_seqlens_k [0, ctx + Q, ctx + P]
    block_table      [[the request's blocks, 0 ...], [0 ...]]            padding token i: position i, slot
                                                                          i % block_size (block 0, the null block)
    last_index       [Q - 1]                the row whose logits are sampled

The graph of size P holds the forward over P tokens, the LM head on row ``last_index`` and the greedy
argmax or fixed_sampler.py's draw (the decode graphs' variants, cuda_graph.py), so such a step is one
upload (``stage``), one replay and one copy back. The backend fixes what its kernels take from the host
per size (``static_prefill_metadata``): the Triton kernel's tile comes from P and its split-KV count from
P and the longest context the runner allows (parts without keys do nothing). The graphs are captured in
the decode graphs' memory pool, counted with them before the KV cache is sized (cuda_graph.py).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from kvmesh.replica.sample.fixed_sampler import sample_and_pack
from kvmesh.replica.sample.sampler import argmax
from kvmesh.replica.utils.cpu_gpu_buffer import CopyFence, CpuGpuBuffer
from kvmesh.replica.worker.graphs.graph_record import record_graph
from torch import nn

PREFILL_SIZES = (16, 32, 64)
"""Query lengths a one-request prefill step is padded to. A few tokens over a long cached prefix is where an
eager step is bound by launching it (9 launches per layer at ~11-16 us of host time each against a forward
of well under a millisecond); past 64 tokens the forward's own work grows while the padding would waste it,
and each size costs four more graphs at start-up."""


def supports_static_prefill(backend, block_size: int) -> bool:
    """Whether ``backend`` runs one-request prefill steps on fixed shapes at this block size."""
    return backend.supports_static_prefill(block_size)


class PrefillInputs:
    """One host staging buffer (pinned on CUDA) and its device twin, at fixed offsets (P_max = the largest size):

        int64 [3, P_max]:  input_ids | positions | slot_mapping
        int64 [4]:         last_index | top_k | draw key | (unused)
        float32 [2]:       temperature | top_p
        int32 [8 + 2 W]:   query_start_loc [3] | cu_seqlens_k [3] | seq_lens [2] | block_table [2, W]"""

    def __init__(self, p_max: int, width: int, block_size: int, device: torch.device) -> None:
        self.p_max, self.width, self.block_size = p_max, width, block_size
        self.nbytes = 8 * (3 * p_max + 4) + 8 + 4 * (8 + 2 * width)
        self.buffer = CpuGpuBuffer(self.nbytes, torch.uint8, device)
        self.fence = CopyFence(device)  # the previous upload has read the host buffer
        (self.host_ids, self.host_positions, self.host_slots), host_extra, host_f32, host_i32 = (
            t.numpy() for t in self._views(self.buffer.cpu))
        self.host_last, self.host_top_k, self.host_key = host_extra[0:1], host_extra[1:2], host_extra[2:3]
        self.host_temperature, self.host_top_p = host_f32[0:1], host_f32[1:2]
        self.host_qsl, self.host_cu_k, self.host_seq_lens = host_i32[0:3], host_i32[3:6], host_i32[6:8]
        self.host_table = host_i32[8:].reshape(2, width)
        self.host_qsl[:], self.host_cu_k[:], self.host_seq_lens[:] = 0, 0, 0  # no tokens until a step is staged
        self.host_top_k[:], self.host_top_p[:] = 1, 1.0
        if self.buffer.gpu is not self.buffer.cpu:
            self.buffer.gpu.copy_(self.buffer.cpu)
        (self.input_ids, self.positions, self.slot_mapping), extra, f32, i32 = self._views(self.buffer.gpu)
        self.last_index, self.top_k, self.keys = extra[0:1], extra[1:2], extra[2:3]
        self.temperature, self.top_p = f32[0:1], f32[1:2]
        self.query_start_loc, self.cu_seqlens_k, self.seq_lens = i32[0:3], i32[3:6], i32[6:8]
        self.block_table = i32[8:].view(2, width)

    def _views(self, arena: torch.Tensor) -> tuple:
        p = self.p_max
        i64 = arena[: 8 * (3 * p + 4)].view(torch.int64)
        f32 = arena[8 * (3 * p + 4): 8 * (3 * p + 5)].view(torch.float32)
        i32 = arena[8 * (3 * p + 5):].view(torch.int32)
        return i64[: 3 * p].view(3, p), i64[3 * p:], f32, i32  # [3, P_max], [4], [2], [8 + 2W]

    def sampling(self) -> tuple[torch.Tensor, ...]:
        """The sampling graph's settings of the one row: temperature, top_k, top_p, draw key (device views)."""
        return self.temperature, self.top_k, self.top_p, self.keys

    def stage(self, size: int, input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
              seq_len: int, block_row: np.ndarray, sampling: tuple | None = None) -> None:
        """Write the step of one request (Q = len(input_ids) tokens, ``seq_len`` = context + Q, its block ids
        ``block_row``) padded to ``size`` tokens, and upload it in one non-blocking copy. ``sampling``: the
        row's (temperature, top_k, top_p, draw key) when the graph samples (else greedy)."""
        q, pad = len(input_ids), size - len(input_ids)
        self.fence.wait()
        self.host_ids[:q], self.host_ids[q:size] = input_ids, 0
        self.host_positions[:q], self.host_positions[q:size] = positions, np.arange(pad)
        self.host_slots[:q], self.host_slots[q:size] = slot_mapping, np.arange(pad) % self.block_size
        self.host_qsl[:] = 0, q, size
        self.host_seq_lens[:] = seq_len, pad
        self.host_cu_k[:] = 0, seq_len, seq_len + pad
        w = len(block_row)
        self.host_table[0, :w], self.host_table[0, w:], self.host_table[1] = block_row, 0, 0
        self.host_last[0] = max(q - 1, 0)
        for host, value, default in zip((self.host_temperature, self.host_top_k, self.host_top_p, self.host_key),
                                        sampling or (None,) * 4, (0.0, 1, 1.0, 0), strict=True):
            host[0] = default if sampling is None else value[0]
        self.buffer.copy_to_gpu(self.nbytes)
        self.fence.record()


class StaticPrefill:
    def __init__(self, model: nn.Module, backend, max_blocks: int, block_size: int, max_seq_len: int,
                 device: torch.device, sizes: tuple[int, ...] = PREFILL_SIZES) -> None:
        if not supports_static_prefill(backend, block_size):
            raise ValueError(f"attention backend {backend.name!r} has no static prefill path at "
                             f"block_size={block_size}")
        self.model, self.device, self.sizes = model, device, tuple(sorted(sizes))
        self.inputs = into = PrefillInputs(self.sizes[-1], max_blocks, block_size, device)
        self.metadata = {p: backend.static_prefill_metadata(into.slot_mapping[:p], into.query_start_loc, into.seq_lens,
                                                            into.cu_seqlens_k, into.block_table, p, max_seq_len)
                         for p in self.sizes}
        # (size, variant) -> the graph and its outputs (logits [1, V], tokens [1], packed logprobs or None)
        self.graphs: dict[tuple[int, str | None], tuple[torch.cuda.CUDAGraph, tuple]] = {}

    def size_for(self, num_tokens: int) -> int | None:
        """The capture size a one-request step of ``num_tokens`` query tokens runs at (None: run it eagerly)."""
        return next((p for p in self.sizes if p >= num_tokens), None)

    def run(self, size: int, sampling: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Logits [1, V], tokens [1] and packed logprobs [1, W] (LOGPROBS, else None) of the step staged at
        ``size`` (``PrefillInputs.stage``): the graph's replay where captured, else the same forward eagerly."""
        if (size, sampling) in self.graphs:
            graph, outputs = self.graphs[size, sampling]
            graph.replay()
            return outputs
        return self._forward(size, sampling)

    def _forward(self, p: int, sampling: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        into = self.inputs
        hidden = self.model(into.input_ids[:p], into.positions[:p], self.metadata[p])  # [P, H]
        logits = self.model.compute_logits(hidden.index_select(0, into.last_index))  # [1, V]: the last real token
        scores = logits.to(torch.float32)
        greedy = argmax(scores)
        if sampling is None:
            return logits, greedy, None
        return logits, *sample_and_pack(scores, greedy, *into.sampling(), sampling)

    def capture(self, variants: tuple, pool) -> object:
        """Record the graphs of every size and variant into ``pool`` (the decode graphs'); returns the pool."""
        empty = np.zeros(0, np.int64)
        for p in reversed(self.sizes):
            self.inputs.stage(p, empty, empty, empty, 0, empty)  # all padding: finite inputs for every size
            for sampling in variants:
                graph, outputs = record_graph(partial(self._forward, p, sampling), self.device, pool)
                pool = graph.pool()
                self.graphs[p, sampling] = (graph, outputs)
        return pool
