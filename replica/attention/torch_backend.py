"""Attention in plain PyTorch (any device): scatter new K/V by slot, gather by block table, SDPA.

Decode rows (one query token each) are attended together in one batched call: their block tables
are gathered into ``[D, L, Hk, Dh]`` (L = longest decode context rounded up to whole blocks) and
keys past each row's ``seq_len`` are masked. Prefill chunks run one request at a time with the
causal diagonal shifted by the cached prefix: query i (position ctx + i) sees keys 0..ctx + i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from kvmesh.replica.attention.metadata import CommonAttentionMetadata


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
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor
    """[T] cache slot of every token of the step."""
    num_decodes: int
    """Leading decode rows."""
    decode_block_tables: torch.Tensor | None
    """[D, max_decode_blocks] block ids of the decode rows."""
    decode_mask: torch.Tensor | None
    """[D, 1, 1, max_decode_blocks * block_size] bool: key position < seq_len."""
    prefills: list[PrefillChunk]
    """The prefill chunks after the decode rows."""


class TorchAttentionBackend:
    name = "torch"

    def build(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata:
        bs, d = common.block_size, common.num_decodes
        device = common.slot_mapping.device
        decode_bt = decode_mask = None
        if d:
            max_len = max(common.seq_lens_cpu[:d])
            num_blocks = -(-max_len // bs)
            decode_bt = common.block_tables[:d, :num_blocks].long()
            key_pos = torch.arange(num_blocks * bs, device=device)
            decode_mask = (key_pos[None, :] < common.seq_lens[:d, None]).view(d, 1, 1, -1)
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
        return TorchAttentionMetadata(common.slot_mapping, d, decode_bt, decode_mask, prefills)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                md: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        if kv_cache is not None:
            k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, Hk, Dh]
            k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [num_slots, Hk, Dh]
            v_flat = v_cache.view(-1, num_kv_heads, head_dim)
            k_flat.index_copy_(0, md.slot_mapping, k)
            v_flat.index_copy_(0, md.slot_mapping, v)
        out = torch.empty_like(q)
        d = md.num_decodes
        if d:
            out[:d] = self._decode(q[:d], k_cache, v_cache, md, scale)
        for chunk in md.prefills:
            qc = q[chunk.q_start:chunk.q_end].transpose(0, 1)  # [Hq, Lq, Dh]
            if chunk.key_slots is None:
                kc = k[chunk.q_start:chunk.q_end].transpose(0, 1)
                vc = v[chunk.q_start:chunk.q_end].transpose(0, 1)
                o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, scale=scale, enable_gqa=True)
            else:
                kc = k_flat[chunk.key_slots].transpose(0, 1)  # [Hk, seq_len, Dh]
                vc = v_flat[chunk.key_slots].transpose(0, 1)
                o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=chunk.mask, scale=scale, enable_gqa=True)
            out[chunk.q_start:chunk.q_end] = o.transpose(0, 1)
        return out

    @staticmethod
    def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, md: TorchAttentionMetadata,
                scale: float) -> torch.Tensor:
        d, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        group = num_heads // num_kv_heads
        # [D, nb, bs, Hk, Dh] -> [D, Hk, L, Dh]
        keys = k_cache[md.decode_block_tables].view(d, -1, num_kv_heads, head_dim).transpose(1, 2)
        values = v_cache[md.decode_block_tables].view(d, -1, num_kv_heads, head_dim).transpose(1, 2)
        qg = q.view(d, num_kv_heads, group, head_dim)  # query heads of one K/V head side by side
        scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale  # [D, Hk, G, L]
        scores.masked_fill_(~md.decode_mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, values).view(d, num_heads, head_dim)
