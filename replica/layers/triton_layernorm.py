"""RMSNorm with the residual add fused in, one Triton program per token row.

Rounding follows transformers' LlamaRMSNorm (and ``RMSNorm.forward_native``) step by step:

    h   = x + residual                        in the activation dtype  -> the new residual
    y   = float32(h) * rsqrt(mean(h^2) + eps)  in float32
    out = weight * dtype(y)                   in the activation dtype

Registered as ``torch.ops.kvmesh.rms_norm`` and ``torch.ops.kvmesh.fused_add_rms_norm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvmesh.replica.layers.op_registry import direct_register_custom_op


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
                     x_stride, residual_stride, n_cols, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype)  # the add happens in the activation dtype, as in the reference
        tl.store(residual_out_ptr + row * n_cols + cols, h, mask=mask)
        h = h.to(tl.float32)
    var = tl.sum(h * h, axis=0) / n_cols
    y = (h * tl.rsqrt(var + eps)).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (w * y).to(dtype), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            out: torch.Tensor, residual_out: torch.Tensor | None) -> None:
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    assert x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1), "rows must be contiguous"
    block_n = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_tokens,)](
        x, residual if residual is not None else x, weight, out,
        residual_out if residual_out is not None else out,
        x.stride(0), residual.stride(0) if residual is not None else 0, hidden, eps,
        HAS_RESIDUAL=residual is not None, BLOCK_N=block_n, num_warps=min(max(block_n // 256, 1), 8))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H] -> norm(x) [T, H]."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [T, H]
    _launch(x, None, weight, eps, out, None)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [T, H] -> (norm(x + residual), x + residual), both [T, H]."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [T, H]
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [T, H]
    _launch(x, residual, weight, eps, out, residual_out)
    return out, residual_out


direct_register_custom_op(
    "rms_norm", "(Tensor x, Tensor weight, float eps) -> Tensor", rms_norm,
    lambda x, weight, eps: torch.empty_like(x))
direct_register_custom_op(
    "fused_add_rms_norm", "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    fused_add_rms_norm, lambda x, residual, weight, eps: (torch.empty_like(x), torch.empty_like(x)))
