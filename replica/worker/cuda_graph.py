"""Decode steps on static shapes: what CUDA graphs capture and replay (vLLM's CUDA-graph decode).

A decode-only step of n rows is padded up to a capture size B >= n and run on buffers whose
addresses never change:

    input_ids [B_max] int64, positions [B_max] int64, slot_mapping [B_max] int64,
    seq_lens [B_max] int32, block_table [B_max, max_blocks] int32       (one set, sliced [:B])
    rows n..B-1 are padding: token 0 at position 0, writing and reading slot 0 (the null block,
    never a request's), seq_len 1 -- finite values, no zero-length edge case in the kernel.
    The buffers start as padding; a step resets only what an earlier, bigger step left there.

A graph holds the forward, the LM head and the greedy argmax: ``run`` returns logits [n, V] and the
argmax tokens [n] (int64) of the rows, both views of the graph's static outputs, valid until the next
``run``. An all-greedy step takes the tokens as they are (no launch after the replay but the copy back);
other steps sample from the logits (sampler.py), as an eager step would. The attention
backend must offer a static decode path: ``supports_static_decode(block_size)`` and
``static_decode_metadata(slot_mapping, seq_lens, block_table)`` over these buffers (triton at every
block size, flash_attn when block_size is a multiple of 256). ``capture()`` (CUDA only) records one
graph per size; without it, ``run`` executes the same padded forward eagerly, which is how the path
is tested on CPU. ``use_cuda_graphs`` turns the ``cuda_graphs`` setting into a decision.

Memory and threads (vLLM captures after sizing the cache and so leaves the graphs outside its budget;
here they are inside it):

    builder thread:  profile forward -> measure_capture (capture every size over a one-block scratch
                     cache, read what it took, free it) -> KV cache sized with that reserved -> allocated
    engine thread:   the runner's bind_thread: set_device, capture() over the real cache, then every replay

A graph replays on the device and stream context it was captured in, so capture runs where replay does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from kvmesh.replica.sample.sampler import argmax
from torch import nn

if TYPE_CHECKING:
    from kvmesh.replica.attention.backend import AttentionBackend

logger = logging.getLogger(__name__)

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
"""Batch sizes a decode step is padded to (the ones up to max_num_seqs are used)."""


def supports_static_decode(backend: AttentionBackend, block_size: int) -> bool:
    return backend.supports_static_decode(block_size)


def use_cuda_graphs(requested: bool | None, device: torch.device, backend: AttentionBackend, block_size: int,
                    tp_size: int = 1) -> bool:
    """``cuda_graphs`` (None: on where they work -- CUDA, a backend with a static decode path at this
    block size, and one rank: capturing torch.distributed's NCCL all-reduce is not something the default
    should bet on) -> whether to capture; an explicit True that cannot work is an error."""
    if requested is None:
        return device.type == "cuda" and supports_static_decode(backend, block_size) and tp_size == 1
    if requested and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs device='cuda', not {device}; drop cuda_graphs")
    if requested and not supports_static_decode(backend, block_size):
        raise ValueError(_no_static_path(backend, block_size))
    return requested


def _no_static_path(backend: AttentionBackend, block_size: int) -> str:
    return (f"attention backend {backend.name!r} has no static decode path at block_size={block_size}; CUDA "
            "graphs need attention_backend='triton' (any block size) or 'flash_attn' with a block_size that is a "
            "multiple of 256")


class StaticDecode:
    def __init__(self, model: nn.Module, backend, max_num_seqs: int, max_blocks: int, block_size: int,
                 device: torch.device) -> None:
        if not supports_static_decode(backend, block_size):
            raise ValueError(_no_static_path(backend, block_size))
        self.model, self.backend, self.device = model, backend, device
        self.sizes = [b for b in CAPTURE_SIZES if b < max_num_seqs] + [max_num_seqs]
        b_max = self.sizes[-1]
        with torch.device(device):
            self.input_ids = torch.zeros(b_max, dtype=torch.int64)
            self.positions = torch.zeros(b_max, dtype=torch.int64)
            self.slot_mapping = torch.zeros(b_max, dtype=torch.int64)
            self.seq_lens = torch.ones(b_max, dtype=torch.int32)
            self.block_table = torch.zeros(b_max, max_blocks, dtype=torch.int32)
        self.metadata = {b: backend.static_decode_metadata(self.slot_mapping[:b], self.seq_lens[:b],
                                                            self.block_table[:b]) for b in self.sizes}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.dirty_rows = 0  # rows [0, dirty_rows) may hold a step's values (padding past them)
        self.table_width = 0  # block_table columns [0, table_width) of those rows may be non-zero

    def size_for(self, n: int) -> int | None:
        """The capture size a step of n decode rows runs at (None: too many rows, run it eagerly)."""
        return next((b for b in self.sizes if b >= n), None)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, common) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [n, V] and greedy tokens [n] of a decode-only step (``common``: its CommonAttentionMetadata)."""
        n = common.num_reqs
        b = self.size_for(n)
        width = common.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(common.slot_mapping)
        self.seq_lens[:n].copy_(common.seq_lens)
        self.block_table[:n, :width].copy_(common.block_tables)
        self._reset_stale(n, b, width)
        if b in self.graphs:
            graph, (logits, tokens) = self.graphs[b]
            graph.replay()
        else:
            logits, tokens = self._forward(b)
        return logits[:n], tokens[:n]

    def _reset_stale(self, n: int, b: int, width: int) -> None:
        """Return what earlier steps left in this step's padding rows n..b-1 (a bigger batch's rows) and past
        column ``width`` of its table to the padding values of the module docstring. A steady batch
        leaves nothing stale, so most steps launch no fill at all."""
        if width < self.table_width:
            self.block_table[:n, width:self.table_width].zero_()
        stale = min(self.dirty_rows, b)
        if stale > n:
            self.input_ids[n:stale].zero_()
            self.positions[n:stale].zero_()
            self.slot_mapping[n:stale].zero_()
            self.seq_lens[n:stale].fill_(1)
            self.block_table[n:stale].zero_()
        if self.dirty_rows <= b:  # every row past n is padding again
            self.dirty_rows, self.table_width = n, width
        else:  # rows past b still hold an earlier step's values (and maybe wider tables)
            self.table_width = max(self.table_width, width)

    def _forward(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(self.input_ids[:b], self.positions[:b], self.metadata[b])  # [b, H]
        logits = self.model.compute_logits(hidden)  # [b, V]
        return logits, argmax(logits.to(torch.float32))  # the sampler's greedy rule: argmax of the fp32 logits

    @torch.inference_mode()
    def measure_capture(self, layers: list, layer_shape: tuple[int, ...], dtype: torch.dtype, read_memory) -> int:
        """Bytes the graphs will take, before there is a KV cache: capture every size over a scratch cache of
        ``layer_shape`` (one block: padding rows read and write only block 0) per attention layer, read the
        device facts (``read_memory``) around it, then free the graphs and the scratch again."""
        from kvmesh.replica.worker.kv_cache import graph_memory

        scratch = torch.zeros(len(layers), *layer_shape, dtype=dtype, device=self.device)  # [L, *layer_shape]
        bound = [attn.kv_cache for attn in layers]
        for i, attn in enumerate(layers):
            attn.kv_cache = scratch[i]
        before = read_memory(self.device)
        self.capture()
        after = read_memory(self.device)
        self.graphs.clear()
        for attn, cache in zip(layers, bound, strict=True):
            attn.kv_cache = cache
        del scratch
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # the graphs' pool goes back to the device, for the KV cache to take
        return graph_memory(before, after)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one CUDA graph per size, largest first (they share one memory pool)."""
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        self.seq_lens.fill_(1)
        pool = None
        for b in reversed(self.sizes):
            self._forward(b)  # warm-up: lazy inits and allocator growth happen outside the capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs = self._forward(b)
            pool = graph.pool()
            self.graphs[b] = (graph, outputs)
        torch.cuda.synchronize(self.device)
        logger.info("captured decode CUDA graphs for batch sizes %s", self.sizes)
