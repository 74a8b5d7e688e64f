"""Attention with flash-attn (imported lazily; chosen on CUDA when flash-attn is installed).

A step's rows come decodes first (see metadata.py). How flash-attn reads the paged cache depends on
the block size, because upstream flash-attn 2 accepts a ``block_table`` only when the page size is
a multiple of ``PAGED_BLOCK_MULTIPLE`` (256):

    paged (block_size % 256 == 0):
        decode rows   -> flash_attn_with_kvcache(q [D, 1, Hq, Dh], k_cache, v_cache,
                                                 cache_seqlens=seq_lens[:D], block_table=block_tables[:D])
                         static shapes per batch size: what a CUDA graph captures (see cuda_graph.py)
        prefill rows  -> flash_attn_varlen_func(q[D:], k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, ...,
                                                block_table=block_tables[D:])
    gathered (any other block size):
        all rows      -> flash_attn_varlen_func over the step's keys gathered into one packed tensor
                         (``key_slots``, built once per step and shared by all layers)

flash-attn aligns the causal diagonal bottom-right, so a query run shorter than its keys (cached
prefix, decode) is right without an offset. The step's new K/V are written by ``slot_mapping``
before attention, so ``cache_seqlens``/``cu_seqlens_k`` count them (context + query).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata

PAGED_BLOCK_MULTIPLE = 256
"""flash-attn 2 reads a block_table only at page sizes that are multiples of this."""


@dataclass(slots=True)
class FlashAttentionMetadata:
    slot_mapping: torch.Tensor
    """[T] int64 cache slot of every token."""
    num_decodes: int
    """Leading decode rows (attended with flash_attn_with_kvcache when paged)."""
    cu_seqlens_q: torch.Tensor
    """[R' + 1] int32 over the rows given to flash_attn_varlen_func (all rows, or the prefills when paged)."""
    cu_seqlens_k: torch.Tensor
    """[R' + 1] int32, context + query length of the same rows."""
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor | None
    """[R', max_blocks] int32 rows of the varlen call when the cache is read paged."""
    key_slots: torch.Tensor | None
    """[sum(seq_lens)] int64 cache slots of every key, when keys are gathered instead."""
    decode_seq_lens: torch.Tensor | None = None
    """[D] int32 cache_seqlens of the decode rows (paged only)."""
    decode_block_table: torch.Tensor | None = None
    """[D, max_blocks] int32 block tables of the decode rows (paged only)."""

    @property
    def num_prefill_rows(self) -> int:
        return self.cu_seqlens_q.numel() - 1


def cumulative(lengths: torch.Tensor) -> torch.Tensor:
    """[n] lengths -> [n + 1] int32 offsets starting at 0 (flash-attn's cu_seqlens)."""
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    torch.cumsum(lengths, 0, out=cu[1:])
    return cu


class FlashAttentionBackend:
    name = "flash_attn"
    fuses_rotary = False  # the model rotates q and k before forward

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    @staticmethod
    def supports_static_decode(block_size: int) -> bool:
        """Decode steps have fixed shapes per batch size (CUDA-graph capturable) only on the paged path."""
        return block_size % PAGED_BLOCK_MULTIPLE == 0

    @staticmethod
    def static_decode_metadata(slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                               block_table: torch.Tensor) -> FlashAttentionMetadata:
        """Metadata of a decode-only step over caller-owned buffers: slot_mapping [B] int64,
        seq_lens [B] int32, block_table [B, max_blocks] int32 (their addresses stay fixed)."""
        empty = torch.zeros(1, dtype=torch.int32, device=seq_lens.device)
        return FlashAttentionMetadata(slot_mapping, seq_lens.numel(), empty, empty, 0, 0, block_table[:0], None,
                                      decode_seq_lens=seq_lens, decode_block_table=block_table)

    @staticmethod
    def supports_static_prefill(block_size: int) -> bool:
        """One-request prefill steps padded to a fixed query length: the paged varlen call reads its lengths
        from the device and takes fixed maxima (prefill_graph.py)."""
        return block_size % PAGED_BLOCK_MULTIPLE == 0

    @staticmethod
    def static_prefill_metadata(slot_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                                cu_seqlens_k: torch.Tensor, block_table: torch.Tensor, num_tokens: int,
                                max_seq_len: int) -> FlashAttentionMetadata:
        """Metadata of a prefill step of ``num_tokens`` tokens over caller-owned buffers (a real request and
        the padding request: query_start_loc and cu_seqlens_k [3], block_table [2, max_blocks] int32)."""
        return FlashAttentionMetadata(slot_mapping, 0, query_start_loc, cu_seqlens_k, num_tokens, max_seq_len,
                                      block_table, None)

    def build(self, common: CommonAttentionMetadata) -> FlashAttentionMetadata:
        bs, d, n = common.block_size, common.num_decodes, common.num_reqs
        if bs % PAGED_BLOCK_MULTIPLE == 0:
            qsl = common.query_start_loc_cpu
            prefill_q = common.query_start_loc[d:] - qsl[d]  # [P + 1] rebased to the prefills, on the device
            max_q = max((b - a for a, b in zip(qsl[d:], qsl[d + 1:], strict=False)), default=0)
            return FlashAttentionMetadata(
                common.slot_mapping, d, prefill_q, cumulative(common.seq_lens[d:]),
                max_q, max(common.seq_lens_cpu[d:], default=0), common.block_tables[d:], None,
                decode_seq_lens=common.seq_lens[:d], decode_block_table=common.block_tables[:d])
        seq_lens = common.seq_lens
        cu_k = cumulative(seq_lens)
        total = sum(common.seq_lens_cpu)
        req = torch.repeat_interleave(torch.arange(n, device=seq_lens.device), seq_lens.long(), output_size=total)
        pos = torch.arange(total, device=seq_lens.device) - cu_k[:-1].long()[req]
        key_slots = common.block_tables[req, pos // bs].long() * bs + pos % bs
        return FlashAttentionMetadata(common.slot_mapping, 0, common.query_start_loc, cu_k, common.max_query_len,
                                      common.max_seq_len, None, key_slots)

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
        if md.key_slots is not None:
            return self._varlen(q, k_flat[md.key_slots], v_flat[md.key_slots], md.cu_seqlens_q, md.cu_seqlens_k,
                                md.max_seqlen_q, md.max_seqlen_k, softmax_scale=scale, causal=True)
        d = md.num_decodes
        if not md.num_prefill_rows:
            return self.decode(q, k_cache, v_cache, md.decode_seq_lens, md.decode_block_table, scale)
        out = torch.empty_like(q)
        if d:
            out[:d] = self.decode(q[:d], k_cache, v_cache, md.decode_seq_lens, md.decode_block_table, scale)
        out[d:] = self._varlen(q[d:], k_cache, v_cache, md.cu_seqlens_q, md.cu_seqlens_k, md.max_seqlen_q,
                               md.max_seqlen_k, softmax_scale=scale, causal=True, block_table=md.block_table)
        return out

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
               block_table: torch.Tensor, scale: float) -> torch.Tensor:
        """q [D, Hq, Dh] of decode rows -> [D, Hq, Dh]: one query per row over its paged context.
        Only tensor arguments of fixed shape per D: the call a CUDA graph captures."""
        out = self._with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=seq_lens, block_table=block_table,
                                 softmax_scale=scale, causal=True)  # [D, 1, Hq, Dh]
        return out.squeeze(1)
