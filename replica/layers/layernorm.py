"""RMSNorm, optionally fused with the residual add (as transformers computes it: float32 inside).

``forward_native`` is the plain-torch reference; ``forward_triton`` is one kernel
(``triton_layernorm.py``) doing the add and the norm with the same rounding.
"""

from __future__ import annotations

import torch
from kvmesh.replica.layers.custom_op import CustomOp, triton_ops
from torch import nn


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)  # [H]

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual)."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def forward_triton(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return triton_ops().rms_norm.default(x, self.weight, self.eps)
        return triton_ops().fused_add_rms_norm.default(x, residual, self.weight, self.eps)
