"""SwiGLU: silu(gate) * up on the fused gate_up projection.

``forward_native`` is the plain-torch reference; ``forward_triton`` is one kernel
(``triton_activation.py``) with the same rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kvmesh.replica.layers.custom_op import CustomOp, triton_ops


class SiluAndMul(CustomOp):
    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)  # x: [T, 2 * I] -> two [T, I]
        return F.silu(gate) * up

    def forward_triton(self, x: torch.Tensor) -> torch.Tensor:
        return triton_ops().silu_and_mul.default(x)  # [T, I]
