"""Attention with flash-attn on CUDA (imported lazily; only chosen when flash-attn is installed).

One ``flash_attn_varlen_func`` call covers the whole mixed batch: flash-attn aligns the causal
diagonal bottom-right, so a query run shorter than its keys (cached prefix, decode) is right.
Upstream flash-attn 2 reads a paged cache through ``block_table`` only when the block size is a
multiple of 256; for smaller blocks the step's keys are first gathered into one packed tensor
(``key_slots``, built once per step and shared by all layers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata

PAGED_BLOCK_MULTIPLE = 256  # flash-attn 2's requirement on the page size of block_table


@dataclass(slots=True)
class FlashAttentionMetadata:
    slot_mapping: torch.Tensor
    """[T] cache slot of every token."""
    cu_seqlens_q: torch.Tensor
    """[R + 1] int32."""
    cu_seqlens_k: torch.Tensor
    """[R + 1] int32."""
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor | None
    """[R, max_blocks] int32 when the cache is read paged."""
    key_slots: torch.Tensor | None
    """[sum(seq_lens)] int64 cache slots of every key, when keys are gathered instead."""


class FlashAttentionBackend:
    name = "flash_attn"

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func

    def build(self, common: CommonAttentionMetadata) -> FlashAttentionMetadata:
        bs = common.block_size
        seq_lens = common.seq_lens
        cu_k = torch.zeros(common.num_reqs + 1, dtype=torch.int32, device=seq_lens.device)
        torch.cumsum(seq_lens, 0, out=cu_k[1:])
        block_table = key_slots = None
        if bs % PAGED_BLOCK_MULTIPLE == 0:
            block_table = common.block_tables
        else:
            total = sum(common.seq_lens_cpu)
            req = torch.repeat_interleave(torch.arange(common.num_reqs, device=seq_lens.device), seq_lens.long(),
                                          output_size=total)
            pos = torch.arange(total, device=seq_lens.device) - cu_k[:-1].long()[req]
            key_slots = common.block_tables[req, pos // bs].long() * bs + pos % bs
        return FlashAttentionMetadata(common.slot_mapping, common.query_start_loc, cu_k, common.max_query_len,
                                      common.max_seq_len, block_table, key_slots)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                md: FlashAttentionMetadata, scale: float) -> torch.Tensor:
        if kv_cache is None:  # profiling run: fresh prefills only
            return self._varlen(q, k, v, md.cu_seqlens_q, md.cu_seqlens_q, md.max_seqlen_q, md.max_seqlen_q,
                                softmax_scale=scale, causal=True)
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, Hk, Dh]
        k_flat, v_flat = k_cache.view(-1, num_kv_heads, head_dim), v_cache.view(-1, num_kv_heads, head_dim)
        k_flat.index_copy_(0, md.slot_mapping, k)
        v_flat.index_copy_(0, md.slot_mapping, v)
        if md.block_table is not None:
            return self._varlen(q, k_cache, v_cache, md.cu_seqlens_q, md.cu_seqlens_k, md.max_seqlen_q,
                                md.max_seqlen_k, softmax_scale=scale, causal=True, block_table=md.block_table)
        return self._varlen(q, k_flat[md.key_slots], v_flat[md.key_slots], md.cu_seqlens_q, md.cu_seqlens_k,
                            md.max_seqlen_q, md.max_seqlen_k, softmax_scale=scale, causal=True)
