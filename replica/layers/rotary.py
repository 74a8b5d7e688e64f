"""Rotary position embedding (NeoX/HF "rotate_half" layout), with linear and Llama-3 scaling.

The cos/sin table is built once for ``max_position`` positions:
    cos_sin_cache: [max_position, head_dim]  = [ cos(p * inv_freq) | sin(p * inv_freq) ]

``forward_native`` returns rotated copies (the plain-torch reference); ``forward_triton`` rotates
q and k in place in one kernel (``triton_rotary.py``) and returns them.
"""

from __future__ import annotations

import math

import torch
from kvmesh.replica.layers.custom_op import CustomOp, triton_ops
from kvmesh.replica.model_config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] as transformers computes them for each rope_type."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type != "llama3":
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(CustomOp):
    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: RopeScaling | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq = rope_inv_freq(head_dim, theta, scaling or {})
        # on inv_freq's device: the model is built inside ``torch.device(target)`` (cuda, or meta in tests)
        positions = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_position, head_dim // 2]
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [max_position, head_dim]
        self.register_buffer("cos_sin_cache", cache.to(torch.get_default_dtype()), persistent=False)

    def forward_native(self, positions: torch.Tensor, q: torch.Tensor,
                       k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, Hq, D] and k [T, Hk, D] by their tokens' positions [T]."""
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2] each
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def forward_triton(self, positions: torch.Tensor, q: torch.Tensor,
                       k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same rotation, written into q and k (views of the qkv projection's output)."""
        triton_ops().rotary_embedding.default(positions, q, k, self.cos_sin_cache)
        return q, k


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
