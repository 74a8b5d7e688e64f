"""SiLU(gate) * up on the fused gate_up output in one Triton launch.

    x row: [ gate (I) | up (I) ]  ->  out row: silu(gate) * up  (I)

silu is computed in float32 and rounded to the activation dtype before the product, as
``F.silu(gate) * up`` rounds it. Registered as ``torch.ops.kvmesh.silu_and_mul``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvmesh.replica.layers.op_registry import direct_register_custom_op

BLOCK_I = 1024
"""Columns per program (a row of intermediate_size I is split over cdiv(I, BLOCK_I) programs)."""


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (silu * up).to(dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2 * I] -> silu(x[:, :I]) * x[:, I:]  [T, I]."""
    num_tokens, width = x.shape
    n_cols = width // 2
    out = torch.empty(num_tokens, n_cols, dtype=x.dtype, device=x.device)  # [T, I]
    if num_tokens == 0:
        return out
    assert x.stride(-1) == 1, "rows must be contiguous"
    block = min(triton.next_power_of_2(n_cols), BLOCK_I)
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(n_cols, block))](x, out, x.stride(0), n_cols, BLOCK=block,
                                                                   num_warps=4)
    return out


direct_register_custom_op(
    "silu_and_mul", "(Tensor x) -> Tensor", silu_and_mul,
    lambda x: x.new_empty(x.shape[0], x.shape[1] // 2))
