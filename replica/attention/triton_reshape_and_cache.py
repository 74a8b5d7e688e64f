"""Write a step's K and V into the paged cache by slot in one launch (vLLM's reshape_and_cache_flash).

    k, v        [T, Hk, Dh]                                  (any token/head strides, e.g. views of qkv)
    caches      [num_blocks, block_size, Hk, Dh]             token t -> block slot_mapping[t] // block_size,
                                                             offset slot_mapping[t] % block_size
    grid        (cdiv(T, BLOCK_T),)                          a tile = BLOCK_T tokens x all Hk * Dh values

Two ``index_copy_`` calls do the same in two launches; under CUDA graphs either is fine, in eager
steps (prefill) every launch counts.

``rotary_and_cache`` folds the rotary embedding in (one program per token: q rotated in place, the
rotated k and v written by slot): a decoder layer then launches one kernel for what were two.
"""

import torch
import triton
import triton.language as tl
from kvmesh.replica.attention.kv_quant import kernel_scales
from kvmesh.replica.attention.triton_attention_folds import to_cache
from kvmesh.replica.layers.triton_rotary import _cos_sin, _rotate_heads, _rotated

BLOCK_T = 16  # tokens per program


@triton.jit(do_not_specialize=("slot_mapping_ptr", "num_tokens"))  # per step: see STEP_VARYING
def _reshape_and_cache_kernel(
        k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, num_tokens,
        stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
        stride_kc_block, stride_kc_slot, stride_kc_head, stride_vc_block, stride_vc_slot, stride_vc_head,
        k_scale_ptr, v_scale_ptr,
        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_X_DIM: tl.constexpr, HD_PADDED: tl.constexpr,
        TOKENS: tl.constexpr, KV_QUANT: tl.constexpr, FP8_MAX: tl.constexpr):
    tok = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)  # [TOKENS]
    offs = tl.arange(0, HD_PADDED)  # [HD_PADDED] = (head, dim) flattened
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    t_ok = tok < num_tokens
    mask = t_ok[:, None] & (offs < HEADS_X_DIM)[None, :]
    slot = tl.load(slot_mapping_ptr + tok, mask=t_ok, other=0).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    tok64 = tok.to(tl.int64)
    k = tl.load(k_ptr + tok64[:, None] * stride_k_tok + (head * stride_k_head + dim)[None, :], mask=mask)
    v = tl.load(v_ptr + tok64[:, None] * stride_v_tok + (head * stride_v_head + dim)[None, :], mask=mask)
    k_dst = (block * stride_kc_block + offset * stride_kc_slot)[:, None] + (head * stride_kc_head + dim)[None, :]
    v_dst = (block * stride_vc_block + offset * stride_vc_slot)[:, None] + (head * stride_vc_head + dim)[None, :]
    tl.store(k_cache_ptr + k_dst, to_cache(k, k_scale_ptr, k_cache_ptr, KV_QUANT, FP8_MAX), mask=mask)
    tl.store(v_cache_ptr + v_dst, to_cache(v, v_scale_ptr, v_cache_ptr, KV_QUANT, FP8_MAX), mask=mask)


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """k/v [T, Hk, Dh] -> k_cache/v_cache [num_blocks, block_size, Hk, Dh] at slot_mapping [T] (int64); an FP8
    cache is written through ``kv_scales`` (k_scale, v_scale: attention/kv_quant.py)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    k_scale, v_scale, kv_quant, fp8_max = kernel_scales(kv_scales, k_cache, slot_mapping)
    grid = (triton.cdiv(num_tokens, BLOCK_T),)
    _reshape_and_cache_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping, num_tokens, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), k_scale, v_scale, BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        HEADS_X_DIM=num_kv_heads * head_dim, HD_PADDED=triton.next_power_of_2(num_kv_heads * head_dim),
        TOKENS=BLOCK_T, KV_QUANT=kv_quant, FP8_MAX=fp8_max)


@triton.jit(do_not_specialize=("positions_ptr", "slot_mapping_ptr"))  # per step: see STEP_VARYING
def _rotary_and_cache_kernel(
        positions_ptr, q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, cos_sin_ptr,
        stride_q_tok, stride_q_head, stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
        stride_kc_block, stride_kc_slot, stride_kc_head, stride_vc_block, stride_vc_slot, stride_vc_head,
        cos_sin_stride, num_q_heads, num_kv_heads, k_scale_ptr, v_scale_ptr,
        BLOCK_SIZE: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr,
        BLOCK_HK: tl.constexpr, KV_QUANT: tl.constexpr, FP8_MAX: tl.constexpr):
    """One token: rotate its q heads in place, write its rotated k and its v into the cache at its slot."""
    token = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    dtype = q_ptr.dtype.element_ty
    cos, sin = _cos_sin(positions_ptr, cos_sin_ptr, cos_sin_stride, token, offs_d, mask_d, dtype, HALF)
    _rotate_heads(q_ptr, stride_q_tok, stride_q_head, token, num_q_heads, cos, sin, offs_d, mask_d, HALF, BLOCK_HQ)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_HK)
    mask = (offs_h < num_kv_heads)[:, None] & mask_d[None, :]  # [BLOCK_HK, BLOCK_D]: one half of each head
    k = k_ptr + token * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :]
    k1, k2 = _rotated(tl.load(k, mask=mask, other=0.0).to(tl.float32),
                      tl.load(k + HALF, mask=mask, other=0.0).to(tl.float32), cos, sin, dtype)
    kc = (k_cache_ptr + block * stride_kc_block + offset * stride_kc_slot
          + offs_h[:, None] * stride_kc_head + offs_d[None, :])
    tl.store(kc, to_cache(k1, k_scale_ptr, k_cache_ptr, KV_QUANT, FP8_MAX), mask=mask)
    tl.store(kc + HALF, to_cache(k2, k_scale_ptr, k_cache_ptr, KV_QUANT, FP8_MAX), mask=mask)
    v = v_ptr + token * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :]
    vc = (v_cache_ptr + block * stride_vc_block + offset * stride_vc_slot
          + offs_h[:, None] * stride_vc_head + offs_d[None, :])
    tl.store(vc, to_cache(tl.load(v, mask=mask), v_scale_ptr, v_cache_ptr, KV_QUANT, FP8_MAX), mask=mask)
    tl.store(vc + HALF, to_cache(tl.load(v + HALF, mask=mask), v_scale_ptr, v_cache_ptr, KV_QUANT, FP8_MAX), mask=mask)


def rotary_and_cache(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                     cos_sin_cache: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """The rotary embedding and the cache write in one launch: q [T, Hq, D] rotated in place by positions [T];
    k [T, Hk, D] rotated and v written into k_cache/v_cache [num_blocks, block_size, Hk, D] at slot_mapping
    [T] (k itself is left as it was). Equals ``RotaryEmbedding`` then ``reshape_and_cache``, bit for bit (an
    FP8 cache: through ``kv_scales``)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_tokens == 0:
        return
    assert all(t.stride(-1) == 1 for t in (q, k, v, k_cache, v_cache, cos_sin_cache)), "head_dim must be contiguous"
    assert head_dim % 2 == 0 and cos_sin_cache.shape[-1] == head_dim, "cos_sin_cache must be [max_position, D]"
    half = head_dim // 2
    k_scale, v_scale, kv_quant, fp8_max = kernel_scales(kv_scales, k_cache, slot_mapping)
    _rotary_and_cache_kernel[(num_tokens,)](
        positions, q, k, v, k_cache, v_cache, slot_mapping, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), cos_sin_cache.stride(0), num_q_heads, num_kv_heads,
        k_scale, v_scale, BLOCK_SIZE=k_cache.shape[1], HALF=half, BLOCK_D=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(num_q_heads), BLOCK_HK=triton.next_power_of_2(num_kv_heads), KV_QUANT=kv_quant,
        FP8_MAX=fp8_max, num_warps=4)
