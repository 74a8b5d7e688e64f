"""Decode steps on static shapes: what CUDA graphs capture and replay (vLLM's CUDA-graph decode).

A decode-only step of n rows is padded up to a capture size B >= n and run on the buffers of
static_inputs.py, whose addresses never change: the step's one upload writes them (padding rows
included) and the graph of size B reads them, with no copy between.

A graph holds the forward, the LM head and the greedy argmax: ``run`` returns logits [n, V], the
argmax tokens [n] (int64) of the rows and None, views of the graph's static outputs, valid until the next
``run``. Each size has three more graphs that sample instead (``run(n, sampling=RANDOM | TOP_K_TOP_P |
LOGPROBS)``): the same forward, then fixed_sampler.py's draw (temperature, top-k, top-p, seeded and
unseeded; RANDOM without the sort, for steps with no top-k/top-p row; LOGPROBS adds the packed logprobs
[n, 2 (1 + 20) + 1], token ids in column 0) with the rows' settings staged beside the inputs. An
all-greedy step or one whose settings the graph covers takes the tokens as they are (no launch after the
replay but the copy back); other steps (logit_bias, min_tokens bans) sample from the logits (sampler.py),
as an eager step would. The attention
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
Short one-request prefill steps have graphs too (``prefill``: prefill_graph.py), captured after the decode
graphs into the same pool, so ``measure_capture`` counts them with the rest.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

import torch
from kvmesh.replica.sample.fixed_sampler import LOGPROBS, RANDOM, TOP_K_TOP_P, sample_and_pack
from kvmesh.replica.sample.sampler import argmax
from kvmesh.replica.worker.graphs.graph_record import record_graph
from kvmesh.replica.worker.graphs.prefill_graph import StaticPrefill, supports_static_prefill
from kvmesh.replica.worker.graphs.static_inputs import StaticInputs
from torch import nn

if TYPE_CHECKING:
    from kvmesh.replica.attention.backend import AttentionBackend

logger = logging.getLogger(__name__)

VARIANTS = (None, RANDOM, TOP_K_TOP_P, LOGPROBS)
"""The graphs of each size: greedy (argmax), then fixed_sampler.py's draws."""
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
                 device: torch.device, max_seq_len: int | None = None) -> None:
        if not supports_static_decode(backend, block_size):
            raise ValueError(_no_static_path(backend, block_size))
        self.model, self.backend, self.device = model, backend, device
        # short one-request prefills (prefill_graph.py), given the longest context, where the backend has the path
        self.prefill = StaticPrefill(model, backend, max_blocks, block_size, max_seq_len, device) \
            if max_seq_len is not None and supports_static_prefill(backend, block_size) else None
        self.sizes = [b for b in CAPTURE_SIZES if b < max_num_seqs] + [max_num_seqs]
        self.inputs = StaticInputs(self.sizes[-1], max_blocks, device)  # the step uploads into these
        self.metadata = {b: backend.static_decode_metadata(self.inputs.slot_mapping[:b], self.inputs.seq_lens[:b],
                                                            self.inputs.block_table[:b]) for b in self.sizes}
        # (size, variant) -> the graph and its outputs (logits, tokens, packed logprobs or None)
        self.graphs: dict[tuple[int, str | None], tuple[torch.cuda.CUDAGraph, tuple]] = {}

    def size_for(self, n: int) -> int | None:
        """The capture size a step of n decode rows runs at (None: too many rows, run it eagerly)."""
        return next((b for b in self.sizes if b >= n), None)

    def run(self, n: int, sampling: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Logits [n, V], tokens [n] and packed logprobs [n, W] (LOGPROBS, else None) of a decode-only step of n
        rows, whose inputs were staged into ``self.inputs`` at its capture size (``StaticInputs.stage``): the
        argmax, or with ``sampling`` (a fixed_sampler.py variant) the draw of the settings staged with them."""
        b = self.size_for(n)
        if (b, sampling) in self.graphs:
            graph, (logits, tokens, packed) = self.graphs[b, sampling]
            graph.replay()
        else:
            logits, tokens, packed = self._forward(b, sampling)
        return logits[:n], tokens[:n], None if packed is None else packed[:n]

    def _forward(self, b: int, sampling: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        hidden = self.model(self.inputs.input_ids[:b], self.inputs.positions[:b], self.metadata[b])  # [b, H]
        logits = self.model.compute_logits(hidden)  # [b, V]
        scores = logits.to(torch.float32)
        greedy = argmax(scores)  # the sampler's greedy rule: argmax of the fp32 logits
        if sampling is None:
            return logits, greedy, None
        return logits, *sample_and_pack(scores, greedy, *self.inputs.sampling(b), sampling)

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
        if self.prefill is not None:
            self.prefill.graphs.clear()
        for attn, cache in zip(layers, bound, strict=True):
            attn.kv_cache = cache
        del scratch
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # the graphs' pool goes back to the device, for the KV cache to take
        return graph_memory(before, after)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record the CUDA graphs of every size and variant, largest first, then the prefill graphs (one
        memory pool for all)."""
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        pool = None  # the inputs hold padding or a finished step's rows: finite values either way
        for b in reversed(self.sizes):
            for sampling in VARIANTS:
                graph, outputs = record_graph(partial(self._forward, b, sampling), self.device, pool)
                pool = graph.pool()
                self.graphs[b, sampling] = (graph, outputs)
        if self.prefill is not None:
            self.prefill.capture(VARIANTS, pool)
        torch.cuda.synchronize(self.device)
        logger.info("captured decode CUDA graphs for batch sizes %s%s", self.sizes, "" if self.prefill is None
                    else f" and one-request prefill graphs for {self.prefill.sizes} tokens")
