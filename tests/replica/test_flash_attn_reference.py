"""The plain-torch flash-attn reference: its numbers against torch SDPA, and the kernel's refusals.

The reference stands in for ``flash_attn`` in CPU tests of the flash_attn backend, so it must (1)
compute what flash-attn computes (checked against PyTorch's own scaled_dot_product_attention) and
(2) refuse every call the CUDA kernel refuses, with the kernel's message.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kvmesh.replica.attention.flash_attn_reference import (
    PAGED_BLOCK_MULTIPLE,
    as_module,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)

HQ, HK, D = 4, 2, 8
PAGE = PAGED_BLOCK_MULTIPLE


def sdpa(q, k, v, causal_offset: int | None) -> torch.Tensor:
    """PyTorch's attention for one sequence, q [Lq, H, D], k/v [Lk, Hk, D]; bottom-right causal."""
    lq, lk = q.shape[0], k.shape[0]
    mask = None
    if causal_offset is not None:
        mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + causal_offset
    kk, vv = (x.repeat_interleave(HQ // HK, dim=1).transpose(0, 1) for x in (k, v))
    return F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask).transpose(0, 1)


def ragged(lens_q, lens_k, seed=0, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), HQ, D, generator=gen).to(dtype)
    k = torch.randn(sum(lens_k), HK, D, generator=gen).to(dtype)
    v = torch.randn(sum(lens_k), HK, D, generator=gen).to(dtype)
    cu = [torch.tensor([0, *lens]).cumsum(0).to(torch.int32) for lens in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1]


def paged(k: torch.Tensor, cu_k: torch.Tensor, num_blocks: int = 8):
    """The packed keys [total_k, Hk, D] laid into a paged cache, each sequence in shuffled blocks."""
    cache = torch.randn(num_blocks, PAGE, HK, D).to(k.dtype)  # stale contents everywhere else
    free = torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(1)).add(1).tolist()
    tables = []
    for b in range(cu_k.numel() - 1):
        start, end = int(cu_k[b]), int(cu_k[b + 1])
        row = [free.pop() for _ in range(-(-(end - start) // PAGE))]
        for i, p in enumerate(range(start, end)):
            cache[row[i // PAGE], i % PAGE] = k[p]
        tables.append(row + [0] * (3 - len(row)))
    return cache, torch.tensor(tables, dtype=torch.int32)


def test_varlen_matches_sdpa_with_bottom_right_causal_alignment():
    lens_q, lens_k = [5, 1, 3], [5, 9, 12]  # fresh prefill, decode, chunk after a 9-token prefix
    q, k, v, cu_q, cu_k = ragged(lens_q, lens_k, dtype=torch.float32)
    out = as_module(allow_float32=True).flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 12, causal=True)
    for b in range(3):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        expected = sdpa(q[qs], k[ks], v[ks], lens_k[b] - lens_q[b])
        torch.testing.assert_close(out[qs], expected, atol=1e-5, rtol=1e-5)


def test_paged_varlen_reads_keys_through_the_block_table():
    lens_q, lens_k = [2, 1], [300, 700]
    q, k, v, cu_q, cu_k = ragged(lens_q, lens_k, seed=2)
    kc, table = paged(k, cu_k)
    vc, _ = paged(v, cu_k)
    packed = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 700, causal=True)
    got = flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 2, 700, causal=True, block_table=table)
    torch.testing.assert_close(got, packed)


def test_kvcache_appends_new_keys_at_cache_seqlens_then_attends():
    gen = torch.Generator().manual_seed(3)
    kc, vc = (torch.zeros(2, 10, HK, D, dtype=torch.bfloat16) for _ in range(2))
    kc[:, :6], vc[:, :6] = (torch.randn(2, 6, HK, D, generator=gen).bfloat16() for _ in range(2))
    q = torch.randn(2, 1, HQ, D, generator=gen).bfloat16()
    k_new, v_new = (torch.randn(2, 1, HK, D, generator=gen).bfloat16() for _ in range(2))
    seqlens = torch.tensor([4, 6], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens, causal=True)
    assert torch.equal(kc[0, 4], k_new[0, 0]) and torch.equal(vc[1, 6], v_new[1, 0])
    for b, n in enumerate([5, 7]):
        expected = sdpa(q[b].float(), kc[b, :n].float(), vc[b, :n].float(), None)
        torch.testing.assert_close(out[b].float(), expected, atol=2e-2, rtol=2e-2)


def test_a_row_that_sees_no_key_gives_zeros_like_the_kernel():
    q, k, v, cu_q, cu_k = ragged([3], [1])  # 3 queries, 1 key: rows 0 and 1 see nothing (bottom-right)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 1, causal=True)
    assert not out[:2].any() and out[2].abs().sum() > 0


@pytest.mark.parametrize("mistake, message", [
    ("int64 block_table", "block_table must have dtype torch.int32"),
    ("int64 cu_seqlens_k", "cu_seqlens_k must have dtype int32"),
    ("float32 q", "FlashAttention only support fp16 and bf16 data type"),
    ("block size 16", "Paged KV cache block size must be divisible by 256"),
    ("block_table columns strided", "block_table must have contiguous last dimension"),
    ("block_table on another device", "must be on"),
    ("key heads do not divide query heads", "Number of heads in key/value must divide"),
])
def test_varlen_refuses_what_the_kernel_refuses(mistake, message):
    q, k, v, cu_q, cu_k = ragged([2, 1], [300, 700], seed=4)
    kc, table = paged(k, cu_k)
    vc = kc.clone()
    if mistake == "int64 block_table":
        table = table.long()
    elif mistake == "int64 cu_seqlens_k":
        cu_k = cu_k.long()
    elif mistake == "float32 q":
        q, kc, vc = q.float(), kc.float(), vc.float()
    elif mistake == "block size 16":
        kc, vc = kc.view(-1, 16, HK, D), vc.view(-1, 16, HK, D)
    elif mistake == "block_table columns strided":
        table = torch.stack([table, table], dim=-1)[..., 0]
    elif mistake == "block_table on another device":
        table = table.to("meta")
    elif mistake == "key heads do not divide query heads":
        q = torch.cat([q, q[:, :1]], dim=1)
    with pytest.raises(RuntimeError, match=message):
        flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 2, 700, causal=True, block_table=table)


@pytest.mark.parametrize("mistake, message", [
    ("int64 cache_seqlens", "seqlens_k must have dtype int32"),
    ("int64 block_table", "block_table must have dtype torch.int32"),
    ("cache_seqlens per token", "seqlens_k must have shape"),
    ("transposed cache", "k_cache must have contiguous last dimension"),
])
def test_kvcache_refuses_what_the_kernel_refuses(mistake, message):
    q, k, v, cu_q, cu_k = ragged([1, 1], [300, 700], seed=5)
    kc, table = paged(k, cu_k)
    seqlens = torch.tensor([300, 700], dtype=torch.int32)
    if mistake == "int64 cache_seqlens":
        seqlens = seqlens.long()
    elif mistake == "int64 block_table":
        table = table.long()
    elif mistake == "cache_seqlens per token":
        seqlens = torch.tensor([300, 700, 1], dtype=torch.int32)
    elif mistake == "transposed cache":
        kc = kc.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises((RuntimeError, AssertionError), match=message):
        flash_attn_with_kvcache(q.view(2, 1, HQ, D), kc, kc, cache_seqlens=seqlens, block_table=table, causal=True)


def test_silent_kernel_garbage_is_a_loud_error_here():
    q, k, v, cu_q, cu_k = ragged([2, 1], [300, 700], seed=6)
    kc, table = paged(k, cu_k)
    with pytest.raises(ValueError, match="above max_seqlen_q"):  # the kernel would skip rows
        flash_attn_varlen_func(q, kc, kc, cu_q, cu_k, 1, 700, causal=True, block_table=table)
    with pytest.raises(ValueError, match="block ids outside"):
        flash_attn_varlen_func(q, kc, kc, cu_q, cu_k, 2, 700, causal=True, block_table=table + 100)
    with pytest.raises(NotImplementedError, match="softcap"):
        flash_attn_varlen_func(q, kc, kc, cu_q, cu_k, 2, 700, softcap=30.0, block_table=table)
