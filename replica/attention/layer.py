"""The attention layer of one decoder layer: owns its slice of the KV cache, delegates to a backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from kvmesh.replica.attention.backend import AttentionBackend
from torch import nn

if TYPE_CHECKING:
    from kvmesh.replica.attention.backend import AttentionMetadata


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int, scale: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads, self.scale = num_heads, head_dim, num_kv_heads, scale
        self.backend: AttentionBackend | None = None
        self.kv_cache: torch.Tensor | None = None  # one layer's cache in the backend's layout, bound by the runner
        self.kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None  # (k_scale, v_scale) of an FP8 cache

    def fuses_rotary(self, rotary_on_triton: bool) -> bool:
        """Whether this layer's backend applies the rotary embedding itself, in its cache-write launch: the
        Triton backend does, when the rotary embedding would have taken its Triton path too."""
        return rotary_on_triton and self.backend.fuses_rotary

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hk, D] -> [T, Hq, D]; ``rotary`` (positions [T], cos_sin_cache) when the
        backend rotates q and k itself (``fuses_rotary``). An FP8 cache (``kv_scales`` set) is written and read
        through the layer's scales (attention/kv_quant.py)."""
        args = (q, k, v, self.kv_cache, metadata, self.scale) + (() if rotary is None else (rotary,))
        if self.kv_scales is None:
            return self.backend.forward(*args)
        return self.backend.forward(*args, kv_scales=self.kv_scales)
