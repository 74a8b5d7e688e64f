"""Write a step's K and V into the paged cache by slot in one launch (vLLM's reshape_and_cache_flash).

    k, v        [T, Hk, Dh]                                  (any token/head strides, e.g. views of qkv)
    caches      [num_blocks, block_size, Hk, Dh]             token t -> block slot_mapping[t] // block_size,
                                                             offset slot_mapping[t] % block_size
    grid        (cdiv(T, BLOCK_T),)                          a tile = BLOCK_T tokens x all Hk * Dh values

Two ``index_copy_`` calls do the same in two launches; under CUDA graphs either is fine, in eager
steps (prefill) every launch counts.
"""

import torch
import triton
import triton.language as tl

BLOCK_T = 16  # tokens per program


@triton.jit
def _reshape_and_cache_kernel(
        k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, num_tokens,
        stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
        stride_kc_block, stride_kc_slot, stride_kc_head, stride_vc_block, stride_vc_slot, stride_vc_head,
        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_X_DIM: tl.constexpr, HD_PADDED: tl.constexpr,
        TOKENS: tl.constexpr):
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
    tl.store(k_cache_ptr + k_dst, k, mask=mask)
    tl.store(v_cache_ptr + v_dst, v, mask=mask)


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """k/v [T, Hk, Dh] -> k_cache/v_cache [num_blocks, block_size, Hk, Dh] at slot_mapping [T] (int64)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    grid = (triton.cdiv(num_tokens, BLOCK_T),)
    _reshape_and_cache_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping, num_tokens, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim, HEADS_X_DIM=num_kv_heads * head_dim,
        HD_PADDED=triton.next_power_of_2(num_kv_heads * head_dim), TOKENS=BLOCK_T)
