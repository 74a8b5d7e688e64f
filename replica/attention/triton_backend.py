"""Attention with kvmesh's own Triton kernel over the paged cache (the default on CUDA).

One kernel (triton_paged_attention.py) serves decode rows, fresh prefills and chunks over a cached
prefix alike, reading K/V straight from the cache through the block table: nothing is gathered and
any block size works. The cache uses flash-attn's layout:

    per layer: [2, num_blocks, block_size, num_kv_heads, head_dim]      (0 = K, 1 = V)
    slot s = block_id * block_size + offset  ->  kv[:, s // block_size, s % block_size]

A prefill step's K/V are written by ``slot_mapping`` (triton_reshape_and_cache.py, one launch, with
the rotary embedding) before the kernel reads them: two launches per layer. A decode-only step is one
launch: the attention kernel rotates q and writes the new K/V itself (triton_attention_folds.py).
Every launch shape comes from host-side sizes (tokens, requests), so ``forward`` never syncs, and
a decode-only step of B rows reads only fixed-shape tensors: ``static_decode_metadata`` is what
cuda_graph.py captures, at every block size. Steps whose programs would leave the GPU's SMs idle
(small decode batches, a short suffix over a long cached prefix) split each context into parts
(split-KV, sized from the SM count), merged by the last part to finish, in the same launch. On CPU
the kernels run through Triton's interpreter (tests; see replica/triton_utils.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvmesh.replica.attention import triton_paged_attention
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.attention.triton_paged_attention import (
    NewTokenKV,
    decode_programs,
    num_kv_splits,
    step_programs,
    tile_shape,
    unified_attention,
)
from kvmesh.replica.attention.triton_reshape_and_cache import reshape_and_cache, rotary_and_cache
from kvmesh.replica.layers.triton_rotary import rotary_embedding


@dataclass(slots=True)
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor
    """[T] int64 cache slot of every token."""
    query_start_loc: torch.Tensor
    """[R + 1] int32 cumulative query lengths."""
    seq_lens: torch.Tensor
    """[R] int32 context + query length of every request."""
    block_table: torch.Tensor
    """[R, max_blocks] int32 block ids of every request (0-padded)."""
    max_query_len: int
    """Longest query run (host-side): picks the kernel's tile; 1 makes a decode-only step."""
    query_start_loc_cpu: list[int] | None = None
    """Host copy of query_start_loc (None for decode-only steps: one token per row)."""
    max_seq_len: int | None = None
    """Longest context + query (host-side; None for decode-only steps, which split by batch size alone)."""
    num_splits: int | None = None
    """Parts each context is cut into (split-KV); decided by the first layer's forward, then reused."""


class TritonAttentionBackend:
    name = "triton"
    fuses_rotary = True  # forward takes (positions, cos_sin_cache): rotary in the cache-write or attention launch

    def __init__(self) -> None:
        self._counters: dict[torch.device, list[torch.Tensor]] = {}  # split-KV arrival counters per device

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    @staticmethod
    def supports_static_decode(block_size: int) -> bool:
        """The kernel reads the block table itself: decode steps have fixed shapes at every block size."""
        return True

    @staticmethod
    def static_decode_metadata(slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                               block_table: torch.Tensor) -> TritonAttentionMetadata:
        """Metadata of a decode-only step over caller-owned buffers: slot_mapping [B] int64, seq_lens [B]
        int32, block_table [B, max_blocks] int32 (addresses fixed); one query token per row."""
        b = seq_lens.numel()
        query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=seq_lens.device)  # [B + 1]
        return TritonAttentionMetadata(slot_mapping, query_start_loc, seq_lens, block_table, 1)

    @staticmethod
    def supports_static_prefill(block_size: int) -> bool:
        """One-request prefill steps padded to a fixed query length have fixed shapes too (prefill_graph.py)."""
        return True

    @staticmethod
    def static_prefill_metadata(slot_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                                cu_seqlens_k: torch.Tensor, block_table: torch.Tensor, num_tokens: int,
                                max_seq_len: int) -> TritonAttentionMetadata:
        """Metadata of a prefill step of ``num_tokens`` tokens over caller-owned buffers (a real request and
        the padding request: query_start_loc [3], seq_lens [2] int32, block_table [2, max_blocks]). The tile
        comes from ``num_tokens`` and the split count, decided by the first forward, from the programs of one
        request of ``num_tokens`` queries over ``max_seq_len`` keys -- host facts fixed per size."""
        return TritonAttentionMetadata(slot_mapping, query_start_loc, seq_lens, block_table, num_tokens,
                                       [0, num_tokens, num_tokens], max_seq_len)

    def build(self, common: CommonAttentionMetadata) -> TritonAttentionMetadata:
        if triton_paged_attention.num_sms(common.seq_lens.device):  # a GPU: split counters, once, outside a step
            self._split_counters(common.seq_lens.device, 0)
        decode_only = common.max_query_len == 1
        return TritonAttentionMetadata(common.slot_mapping, common.query_start_loc, common.seq_lens,
                                       common.block_tables, common.max_query_len,
                                       None if decode_only else common.query_start_loc_cpu,
                                       None if decode_only else common.max_seq_len)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                md: TritonAttentionMetadata, scale: float,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``rotary`` (positions [T], cos_sin_cache [max_position, Dh]): q and k are not rotated yet; q is
        rotated in place and k as it is written into the cache, in the cache write's one launch. ``kv_scales``
        (k_scale, v_scale): an FP8 cache, quantized as written and dequantized as read (kv_quant.py)."""
        out = torch.empty_like(q)  # [T, Hq, Dh]
        if kv_cache is None and rotary is not None:  # profiling: no cache to write into
            rotary_embedding(rotary[0], q, k, rotary[1])
        if kv_cache is None:  # profiling run: fresh prefills only, attended from k/v as a cache of 1-token blocks
            k_cache, v_cache = k.unsqueeze(1), v.unsqueeze(1)  # [T, 1, Hk, Dh]: block t holds token t
            positions = torch.arange(md.max_query_len, dtype=torch.int32, device=q.device)
            last = q.shape[0] - 1
            block_table = (md.query_start_loc[:-1, None] + positions).clamp_(max=last)  # [R, max_query_len]
            return unified_attention(q, k_cache, v_cache, out, md.query_start_loc, md.seq_lens, block_table, scale,
                                     md.max_query_len)
        k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, Hk, Dh]
        new_kv = None  # a decode-only step: rotary and the cache write inside the attention launch
        if rotary is not None and md.max_query_len == 1:
            new_kv = NewTokenKV(k, v, rotary[0], md.slot_mapping, rotary[1])
        elif rotary is None:
            reshape_and_cache(k, v, k_cache, v_cache, md.slot_mapping, kv_scales)
        else:
            rotary_and_cache(rotary[0], q, k, v, k_cache, v_cache, md.slot_mapping, rotary[1], kv_scales)
        if md.num_splits is None:
            md.num_splits = self.num_splits(md, q.shape[1] // k.shape[1], k.shape[1], q.device)
        counters = None
        if md.num_splits > 1:
            block_q, _ = tile_shape(q.shape[1] // k.shape[1], md.max_query_len)
            counters = self._split_counters(q.device, (q.shape[0] // block_q + md.seq_lens.shape[0]) * k.shape[1])
        return unified_attention(q, k_cache, v_cache, out, md.query_start_loc, md.seq_lens, md.block_table, scale,
                                 md.max_query_len, md.num_splits, new_kv, counters, kv_scales)

    def _split_counters(self, device: torch.device, needed: int) -> torch.Tensor:
        """The split launches' arrival counters (>= ``needed``), zeroed once and left zero by every launch.
        Allocated by the first step's ``build`` on a GPU at twice its SM count, which bounds every split
        launch (it splits only while its working programs are fewer than the SMs, and its grid has at most
        twice its working programs), so a captured CUDA graph keeps reading the same counters; a launch that
        outgrows them (a forced split) gets larger ones, and the old stay allocated for graphs that hold them."""
        held = self._counters.setdefault(device, [])
        if not held or held[-1].numel() < needed:
            size = max(needed, 2 * triton_paged_attention.num_sms(device))
            held.append(torch.zeros(size, dtype=torch.int32, device=device))
        return held[-1]

    @staticmethod
    def num_splits(md: TritonAttentionMetadata, num_queries_per_kv: int, num_kv_heads: int,
                   device: torch.device) -> int:
        """Split-KV parts for this step: enough programs to fill the device's SMs (host facts only)."""
        if md.query_start_loc_cpu is None:  # decode-only
            return num_kv_splits(decode_programs(md.seq_lens.shape[0], num_kv_heads), device)
        programs = step_programs(md.query_start_loc_cpu, num_queries_per_kv, md.max_query_len, num_kv_heads)
        return num_kv_splits(programs, device, md.max_seq_len)
