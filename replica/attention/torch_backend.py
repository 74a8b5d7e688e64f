"""Attention in plain PyTorch (any device): scatter new K/V by slot, gather by block table, SDPA.

The cache is head-major so that gathering a batch's blocks yields, with one ``index_select`` and
no transposes, exactly the ``[heads, keys, head_dim]`` operand batched matmuls want:

    per layer: [2, num_kv_heads, num_blocks, block_size, head_dim]
    slot s = block_id * block_size + offset  ->  kv[:, h].view(-1, head_dim)[s]

Decode rows (one query token each) are attended together in a few groups: the runner orders them
longest first, and rows whose context is at least half the group's longest share a group. A
group's blocks are gathered into ``[Hk * rows, L, Dh]`` (L = its longest context in whole
blocks), keys past each row's ``seq_len`` get -inf. Grouping bounds the padding the gather copies. Prefill chunks run
one request at a time with the causal diagonal shifted by
the cached prefix: query i (position ctx + i) sees keys 0..ctx + i.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from kvmesh.replica.attention.kv_quant import dequantize, is_fp8, quantize
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.utils.cpu_gpu_buffer import to_device


@dataclass(slots=True)
class PrefillChunk:
    """One request's query run in the prefill part of the batch."""

    q_start: int
    q_end: int
    key_slots: torch.Tensor | None
    """[seq_len] cache slots of all its keys, or None for a fresh prefill (keys = this step's k/v)."""
    mask: torch.Tensor | None
    """[q_len, seq_len] bool (True = attend) when a cached prefix shifts the causal diagonal."""


@dataclass(slots=True)
class DecodeGroup:
    """Consecutive decode rows attended with one padded gather."""

    start: int
    end: int
    block_ids: torch.Tensor
    """[(end - start) * max_blocks] int64 block ids, row after row (0-padded)."""
    bias: torch.Tensor
    """[end - start, 1, max_blocks * block_size] float: 0 where key position < seq_len, else -inf."""
    pv_rows: torch.Tensor | None = None
    """[Hk * rows * G * L] value rows each query head sums (built by the first layer, reused by the rest)."""
    pv_offsets: torch.Tensor | None = None
    """[Hk * rows * G] start of each query head's bag in ``pv_rows``."""


MIN_GROUP_ROWS = 8  # a decode group is never cut below this many rows (per-group cost is fixed)


@dataclass(slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor
    """[T] cache slot of every token of the step."""
    num_decodes: int
    """Leading decode rows."""
    decode_groups: list[DecodeGroup]
    """The decode rows, in groups of similar context length."""
    prefills: list[PrefillChunk]
    """The prefill chunks after the decode rows."""


class TorchAttentionBackend:
    name = "torch"
    fuses_rotary = False  # the model rotates q and k before forward

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (2, num_kv_heads, num_blocks, block_size, head_dim)

    @staticmethod
    def supports_static_decode(block_size: int) -> bool:
        """The reference path sizes its work by the step's contexts: no static decode, no CUDA graphs."""
        return False

    @staticmethod
    def supports_static_prefill(block_size: int) -> bool:
        """Nor static prefill."""
        return False

    def build(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata:
        bs, d = common.block_size, common.num_decodes
        device = common.slot_mapping.device
        groups = []
        if d:
            seq_lens = np.asarray(common.seq_lens_cpu[:d])
            blocks = (seq_lens + bs - 1) // bs  # [D], non-increasing: longest first
            neg = -blocks  # non-decreasing, for searchsorted
            tables = common.block_tables_cpu
            if tables is None:
                tables = common.block_tables.cpu().numpy()
            start = 0
            while start < d:
                # the group runs while rows are at least half as long as its first (and >= MIN_GROUP_ROWS rows)
                end = int(np.searchsorted(neg, -(blocks[start] / 2), side="right"))
                end = min(d, max(end, start + MIN_GROUP_ROWS))
                width = int(blocks[start:end].max())  # == blocks[start] when rows come longest first
                # host arithmetic (numpy), one copy each to the device
                ids = tables[start:end, :width].reshape(-1).astype(np.int64)  # int64: 3x faster gathers
                bias = np.where(np.arange(width * bs)[None, :] >= seq_lens[start:end, None], -np.inf, 0.0)
                groups.append(DecodeGroup(start, end, to_device(ids, torch.int64, device),
                                          to_device(bias[:, None], torch.float32, device)))
                start = end
        prefills = []
        qsl, seq_lens = common.query_start_loc_cpu, common.seq_lens_cpu
        for i in range(d, common.num_reqs):
            q_len, seq_len = qsl[i + 1] - qsl[i], seq_lens[i]
            ctx = seq_len - q_len
            key_slots = mask = None
            if ctx:
                nb = -(-seq_len // bs)
                bt = common.block_tables[i, :nb].long()
                key_slots = (bt[:, None] * bs + torch.arange(bs, device=device)).view(-1)[:seq_len]
                q_pos = torch.arange(ctx, seq_len, device=device)
                mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
            prefills.append(PrefillChunk(qsl[i], qsl[i + 1], key_slots, mask))
        return TorchAttentionMetadata(common.slot_mapping, d, groups, prefills)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                md: TorchAttentionMetadata, scale: float,
                kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``kv_scales`` (k_scale, v_scale): the cache is FP8 (kv_quant.py); k/v are quantized as they are written
        and every read dequantizes, a fresh prefill's own k/v included (what a later read of them would see)."""
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        kv_scales = kv_scales if kv_cache is not None else None  # profiling: no cache, nothing quantized
        if kv_scales is not None:
            k, v = (quantize(x, s, kv_cache.dtype) for x, s in zip((k, v), kv_scales, strict=True))
        if kv_cache is not None:
            k_slots = kv_cache[0].view(num_kv_heads, -1, head_dim)  # [Hk, num_slots, Dh]
            v_slots = kv_cache[1].view(num_kv_heads, -1, head_dim)
            _bytes(k_slots).index_copy_(1, md.slot_mapping, _bytes(k.transpose(0, 1)))
            _bytes(v_slots).index_copy_(1, md.slot_mapping, _bytes(v.transpose(0, 1)))
            num_slots = k_slots.shape[1]
        if kv_scales is not None:
            k, v = (dequantize(x, s, q.dtype) for x, s in zip((k, v), kv_scales, strict=True))
        k_scale, v_scale = kv_scales or (None, None)
        out = torch.empty_like(q)
        for g in md.decode_groups:
            out[g.start:g.end] = self._decode(q[g.start:g.end], kv_cache, g, scale, kv_scales)
        gqa = q.shape[1] // num_kv_heads
        for chunk in md.prefills:
            qc = q[chunk.q_start:chunk.q_end].transpose(0, 1)  # [Hq, Lq, Dh]
            if chunk.key_slots is None:
                kc = k[chunk.q_start:chunk.q_end].transpose(0, 1)  # [Hk, Lq, Dh]
                vc = v[chunk.q_start:chunk.q_end].transpose(0, 1)
            else:
                rows = _head_offsets(num_kv_heads, num_slots, chunk.key_slots)  # rows of [Hk * num_slots, Dh]
                kc = _gather(k_slots.view(-1, head_dim), rows, k_scale, q.dtype).view(num_kv_heads, -1, head_dim)
                vc = _gather(v_slots.view(-1, head_dim), rows, v_scale, q.dtype).view(num_kv_heads, -1, head_dim)
            if gqa > 1:  # SDPA's fused CPU kernels take neither enable_gqa nor 3-d inputs (4x slower)
                kc, vc = kc.repeat_interleave(gqa, dim=0), vc.repeat_interleave(gqa, dim=0)
            o = F.scaled_dot_product_attention(qc[None], kc[None], vc[None], attn_mask=chunk.mask,
                                               is_causal=chunk.mask is None, scale=scale)
            out[chunk.q_start:chunk.q_end] = o[0].transpose(0, 1)
        return out

    @staticmethod
    def _decode(q: torch.Tensor, kv_cache: torch.Tensor, dg: DecodeGroup, scale: float,
                kv_scales: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        d, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[1]
        gqa = num_heads // num_kv_heads
        # rows of the [Hk * num_blocks, bs * Dh] view -> [Hk * D, L, Dh]: row (h, d) = request d's keys of head h
        rows = _head_offsets(num_kv_heads, kv_cache.shape[2], dg.block_ids)
        block_dim = kv_cache.shape[3] * head_dim
        k_scale, v_scale = kv_scales or (None, None)
        keys = _gather(kv_cache[0].view(-1, block_dim), rows, k_scale, q.dtype).view(num_kv_heads * d, -1, head_dim)
        # query heads of one K/V head side by side: [D, Hk, G, Dh] -> [Hk * D, G, Dh]
        qg = (q * scale).view(d, num_kv_heads, gqa, head_dim).transpose(0, 1).reshape(-1, gqa, head_dim)
        scores = torch.bmm(qg, keys.transpose(1, 2))  # [Hk * D, G, L]
        scores.view(num_kv_heads, d, gqa, -1).add_(dg.bias)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        if v_scale is not None:  # FP8 values: gathered and dequantized like the keys (no embedding_bag over FP8)
            values = _gather(kv_cache[1].view(-1, block_dim), rows, v_scale, q.dtype).view(num_kv_heads * d, -1,
                                                                                           head_dim)
            out = torch.bmm(probs, values)  # [Hk * D, G, Dh]
            return out.view(num_kv_heads, d, gqa, head_dim).transpose(0, 1).reshape(d, num_heads, head_dim)
        # probs @ V without gathering V: each query head's output is a weighted sum of value rows
        if dg.pv_rows is None:
            block_size, length = kv_cache.shape[3], scores.shape[-1]
            slots = (dg.block_ids.view(d, -1, 1) * block_size + torch.arange(block_size, device=q.device)).view(d, -1)
            per_head = _head_offsets(num_kv_heads, kv_cache.shape[2] * block_size, slots.view(-1)).view(-1, 1, length)
            dg.pv_rows = per_head.expand(-1, gqa, -1).reshape(-1)  # [Hk * D * G * L]
            dg.pv_offsets = torch.arange(0, dg.pv_rows.numel(), length, device=q.device)
        out = F.embedding_bag(dg.pv_rows, kv_cache[1].view(-1, head_dim), dg.pv_offsets, mode="sum",
                              per_sample_weights=probs.view(-1))  # [Hk * D * G, Dh]
        return out.view(num_kv_heads, d, gqa, head_dim).transpose(0, 1).reshape(d, num_heads, head_dim)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """An FP8 tensor as uint8 (the same bytes: index_copy_/index_select take no FP8 on every device); else x."""
    return x.view(torch.uint8) if is_fp8(x.dtype) else x


def _gather(rows_of: torch.Tensor, ids: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of the 2-d cache view ``rows_of``, dequantized to ``dtype`` when ``scale`` is given (FP8)."""
    if scale is None:
        return rows_of.index_select(0, ids)
    return dequantize(_bytes(rows_of).index_select(0, ids).view(rows_of.dtype), scale, dtype)


def _head_offsets(num_kv_heads: int, per_head: int, ids: torch.Tensor) -> torch.Tensor:
    """Row ids of every head's copy of ``ids`` in a [num_kv_heads * per_head, ...] view (head-major)."""
    heads = torch.arange(num_kv_heads, device=ids.device) * per_head
    return (heads[:, None] + ids[None, :]).view(-1)
