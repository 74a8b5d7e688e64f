"""Rotary embedding applied in place to q and k in one Triton launch (NeoX "rotate_half" layout).

One program per token: it reads the token's row of ``cos_sin_cache`` once and rotates all its
q heads and all its k heads. q and k may be strided views of the fused qkv projection output:

    qkv row of a token: [ q: Hq x D | k: Hk x D | v: Hk x D ]
    head row x = [ x1 (D/2) | x2 (D/2) ]  ->  [ x1 cos - x2 sin | x2 cos + x1 sin ]

Products and sums are rounded to the activation dtype where ``RotaryEmbedding.forward_native``
(and transformers) round them, so both paths agree in bf16/fp16 too.
Registered as ``torch.ops.kvmesh.rotary_embedding`` (mutates q and k).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvmesh.replica.layers.op_registry import direct_register_custom_op


@triton.jit
def _rotated(x1, x2, cos, sin, dtype: tl.constexpr):
    """The rotated halves of x = [x1 | x2] (float32 tiles, cos/sin [BLOCK_D] float32), rounded to ``dtype``
    where the reference rounds: each product, then the sum."""
    x1_cos, x2_sin = (x1 * cos[None, :]).to(dtype).to(tl.float32), (x2 * sin[None, :]).to(dtype).to(tl.float32)
    x2_cos, x1_sin = (x2 * cos[None, :]).to(dtype).to(tl.float32), (x1 * sin[None, :]).to(dtype).to(tl.float32)
    return (x1_cos - x2_sin).to(dtype), (x2_cos + x1_sin).to(dtype)


@triton.jit
def _rotate_heads(x_ptr, token_stride, head_stride, token, num_heads, cos, sin, offs_d, mask_d,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rotate the ``num_heads`` heads of one token in place (cos/sin: [BLOCK_D] float32)."""
    dtype = x_ptr.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    ptr = x_ptr + token * token_stride + offs_h[:, None] * head_stride + offs_d[None, :]  # [BLOCK_H, BLOCK_D]
    mask = (offs_h < num_heads)[:, None] & mask_d[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    out1, out2 = _rotated(x1, x2, cos, sin, dtype)
    tl.store(ptr, out1, mask=mask)
    tl.store(ptr + HALF, out2, mask=mask)


@triton.jit
def _cos_sin(positions_ptr, cos_sin_ptr, cos_sin_stride, token, offs_d, mask_d, dtype: tl.constexpr,
             HALF: tl.constexpr):
    """cos, sin [BLOCK_D] float32 of ``token``'s position (the table cast to the activation dtype, as the
    reference multiplies by it)."""
    position = tl.load(positions_ptr + token).to(tl.int64)
    row = cos_sin_ptr + position * cos_sin_stride  # [ cos (D/2) | sin (D/2) ]
    cos = tl.load(row + offs_d, mask=mask_d, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(row + HALF + offs_d, mask=mask_d, other=0.0).to(dtype).to(tl.float32)
    return cos, sin


@triton.jit(do_not_specialize=("positions_ptr",))  # a view of the step's upload: alignment varies per step
def _rotary_kernel(positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
                   q_token_stride, q_head_stride, k_token_stride, k_head_stride, cos_sin_stride,
                   num_q_heads, num_k_heads,
                   HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    cos, sin = _cos_sin(positions_ptr, cos_sin_ptr, cos_sin_stride, token, offs_d, mask_d, q_ptr.dtype.element_ty,
                        HALF)
    _rotate_heads(q_ptr, q_token_stride, q_head_stride, token, num_q_heads, cos, sin, offs_d, mask_d,
                  HALF, BLOCK_HQ)
    _rotate_heads(k_ptr, k_token_stride, k_head_stride, token, num_k_heads, cos, sin, offs_d, mask_d,
                  HALF, BLOCK_HK)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place by positions [T] (cos_sin_cache [max_position, D])."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    if num_tokens == 0:
        return
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1, "head_dim must be contiguous"
    assert head_dim % 2 == 0 and cos_sin_cache.shape[-1] == head_dim, "cos_sin_cache must be [max_position, D]"
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        positions, q, k, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos_sin_cache.stride(0), num_q_heads, num_k_heads,
        HALF=half, BLOCK_D=triton.next_power_of_2(half), BLOCK_HQ=triton.next_power_of_2(num_q_heads),
        BLOCK_HK=triton.next_power_of_2(num_k_heads), num_warps=4)


direct_register_custom_op(
    "rotary_embedding", "(Tensor positions, Tensor(a!) q, Tensor(b!) k, Tensor cos_sin_cache) -> ()",
    rotary_embedding, lambda positions, q, k, cos_sin_cache: None)
