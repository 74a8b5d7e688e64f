"""SwiGLU: silu(gate) * up on the fused gate_up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)  # x: [T, 2 * I] -> two [T, I]
        return F.silu(gate) * up
