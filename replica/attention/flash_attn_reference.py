"""flash-attn 2's two inference entry points in plain torch, with the kernel's argument checks.

Written from flash-attn's own sources (``flash_attn/flash_attn_interface.py`` for the Python
signatures and defaults, ``csrc/flash_attn/flash_api.cpp`` ``mha_varlen_fwd`` / ``mha_fwd_kvcache``
for the checks), so that kvmesh's ``flash_attn`` backend can run, and be checked, on a CPU:

    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None)
        q [total_q, H, D]; k/v [total_k, Hk, D], or paged [num_blocks, page_block_size, Hk, D]
        with block_table [batch, max_blocks_per_seq] -> out [total_q, H, D]
    flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                            softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False)
        q [batch, seqlen_q, H, D]; caches [batch_c, seqlen_k, Hk, D] or paged as above;
        cache_seqlens int or [batch] int32 -> out [batch, seqlen_q, H, D]

Semantics kept: GQA (query head h reads K/V head h // (H / Hk)); ``causal`` aligned bottom-right
(query i of a run of Lq sees keys j <= i + Lk - Lq; a row that sees no key gives zeros); with
``k``/``v``, ``flash_attn_with_kvcache`` writes them into the cache at ``cache_seqlens`` first;
scores and softmax in float32, output in q's dtype.

Checks kept, with the kernel's messages (RuntimeError, as TORCH_CHECK raises): q/k/v fp16 or bf16
and alike; cu_seqlens_*, block_table and cache_seqlens int32; block_table and cache tensors with
a contiguous last dimension; paged page_block_size a multiple of ``PAGED_BLOCK_MULTIPLE`` (256 in
upstream flash-attn 2.x; vLLM's fork accepts 16); shapes; H divisible by Hk; head dim <= 256.

Deviations, on purpose:
- device: the kernel wants CUDA tensors; here every tensor must be on q's device (any device), so a
  tensor left behind on another device still fails.
- float32: the kernel refuses it. The functions here refuse it too; ``as_module(allow_float32=True)``
  builds a module that accepts it, so CPU tests can compare float32 tokens with the torch backend
  exactly (bf16 on CPU would blur token identity with rounding, not with calling mistakes).
- what the kernel computes silently wrong (a run longer than ``max_seqlen_q``, a block id past the
  pool, a block table too short for its sequence) raises ValueError here instead of giving garbage.
- dropout, sliding windows, softcap, ALiBi, rotary, cache_batch_idx/cache_leftpad and returned
  probabilities are not implemented (kvmesh calls none of them): NotImplementedError.
"""

from __future__ import annotations

import types

import torch

PAGED_BLOCK_MULTIPLE = 256
"""flash-attn 2 (upstream) reads a paged cache only when its page size is a multiple of this."""
MAX_HEAD_DIM = 256
_HALF = (torch.float16, torch.bfloat16)
SUPPORTED_DEVICES = ("cuda", "cpu")
"""Device types this implementation runs on (the real module has no such attribute: CUDA only)."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


def _unsupported(**features) -> None:
    used = [name for name, on in features.items() if on]
    if used:
        raise NotImplementedError(f"flash-attn reference: {', '.join(used)} not implemented (kvmesh calls none)")


def _check_common(q, k, v, allow_float32: bool, tensors: dict) -> None:
    _check(q.dtype in _HALF or (allow_float32 and q.dtype == torch.float32),
           "FlashAttention only support fp16 and bf16 data type")
    _check(k.dtype == q.dtype, "query and key must have the same dtype")
    _check(v.dtype == q.dtype, "query and value must have the same dtype")
    for name, t in tensors.items():
        if t is not None:
            _check(t.device == q.device, f"{name} must be on {q.device} like q (the kernel: must be on CUDA)")
    _check(q.shape[-1] <= MAX_HEAD_DIM, f"FlashAttention forward only supports head dimension at most {MAX_HEAD_DIM}")


def _check_block_table(block_table: torch.Tensor, k: torch.Tensor) -> int:
    _check(block_table.dtype == torch.int32, "block_table must have dtype torch.int32")
    _check(block_table.stride(-1) == 1, "block_table must have contiguous last dimension")
    page_block_size = k.shape[1]
    _check(page_block_size % PAGED_BLOCK_MULTIPLE == 0,
           f"Paged KV cache block size must be divisible by {PAGED_BLOCK_MULTIPLE}")
    return page_block_size


def _check_shape(name: str, t: torch.Tensor, shape: tuple, what: str) -> None:
    _check(tuple(t.shape) == tuple(shape), f"{name} must have shape ({what})")


def _paged_keys(cache: torch.Tensor, table_row: torch.Tensor, seqlen: int) -> torch.Tensor:
    """The first ``seqlen`` positions of one sequence of a paged cache -> [seqlen, Hk, D]."""
    num_blocks, page = cache.shape[0], cache.shape[1]
    needed = -(-seqlen // page)
    if needed > table_row.numel():
        raise ValueError(f"block table row has {table_row.numel()} blocks of {page}; the sequence needs {needed}")
    ids = table_row[:needed].long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise ValueError(f"block table holds block ids outside [0, {num_blocks}): {ids.tolist()}")
    return cache[ids].reshape(-1, *cache.shape[2:])[:seqlen]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """One sequence: q [Lq, H, D], k/v [Lk, Hk, D] -> [Lq, H, D] (float32 math, q's dtype out)."""
    lq, h, _ = q.shape
    lk, hk = k.shape[0], k.shape[1]
    if lk == 0:
        return torch.zeros_like(q)
    kf = k.float().repeat_interleave(h // hk, dim=1)  # [Lk, H, D]
    vf = v.float().repeat_interleave(h // hk, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale  # [H, Lq, Lk]
    if causal:
        visible = torch.arange(lk, device=q.device)[None, :] <= torch.arange(lq, device=q.device)[:, None] + lk - lq
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows without a visible key -> zeros
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, vf).to(q.dtype)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
            causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
            return_attn_probs=False, block_table=None, *, allow_float32=False):
    _unsupported(dropout=dropout_p > 0, window_size=tuple(window_size) != (-1, -1), softcap=softcap > 0,
                 alibi_slopes=alibi_slopes is not None, return_attn_probs=return_attn_probs)
    _check_common(q, k, v, allow_float32, {"k": k, "v": v, "cu_seqlens_q": cu_seqlens_q,
                                           "cu_seqlens_k": cu_seqlens_k, "block_table": block_table})
    _check(cu_seqlens_q.dtype == torch.int32, "cu_seqlens_q must have dtype int32")
    _check(cu_seqlens_k.dtype == torch.int32, "cu_seqlens_k must have dtype int32")
    _check(cu_seqlens_q.is_contiguous(), "cu_seqlens_q must be contiguous")
    _check(cu_seqlens_k.is_contiguous(), "cu_seqlens_k must be contiguous")
    batch = cu_seqlens_q.numel() - 1
    _check(batch > 0, "batch size must be positive")
    total_q, h, d = q.shape
    paged = block_table is not None
    hk = k.shape[2] if paged else k.shape[1]
    _check(h % hk == 0, "Number of heads in key/value must divide number of heads in query")
    if paged:
        page = _check_block_table(block_table, k)
        _check_shape("k", k, (k.shape[0], page, hk, d), "num_blocks, page_block_size, num_heads_k, head_size_og")
        _check_shape("v", v, tuple(k.shape), "num_blocks, page_block_size, num_heads_k, head_size_og")
        _check_shape("block_table", block_table, (batch, block_table.shape[-1]), "batch_size, max_num_blocks_per_seq")
    else:
        _check_shape("k", k, (k.shape[0], hk, d), "total_k, num_heads_k, head_size_og")
        _check_shape("v", v, tuple(k.shape), "total_k, num_heads_k, head_size_og")
    _check_shape("cu_seqlens_k", cu_seqlens_k, (batch + 1,), "batch_size + 1")
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if cq[0] != 0 or cq[-1] != total_q or any(b < a for a, b in zip(cq, cq[1:], strict=False)):
        raise ValueError(f"cu_seqlens_q must rise from 0 to total_q={total_q}, got {cq}")
    rising_k = all(b >= a for a, b in zip(ck, ck[1:], strict=False))
    if ck[0] != 0 or not rising_k or (not paged and ck[-1] > k.shape[0]):
        raise ValueError(f"cu_seqlens_k must rise from 0 (to at most total_k={k.shape[0]} unpaged), got {ck}")
    out = torch.empty_like(q)
    for b in range(batch):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if lq > max_seqlen_q or lk > max_seqlen_k:
            raise ValueError(f"sequence {b} has {lq} queries / {lk} keys, above max_seqlen_q={max_seqlen_q} / "
                             f"max_seqlen_k={max_seqlen_k} (the kernel would leave positions uncomputed)")
        if paged:
            kb, vb = _paged_keys(k, block_table[b], lk), _paged_keys(v, block_table[b], lk)
        else:
            kb, vb = k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        out[cq[b]:cq[b + 1]] = _attend(q[cq[b]:cq[b + 1]], kb, vb, scale, causal and max_seqlen_q > 1)
    return out


def _with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                  cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                  window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                  return_softmax_lse=False, *, allow_float32=False):
    _unsupported(rotary=rotary_cos is not None or rotary_sin is not None, cache_batch_idx=cache_batch_idx is not None,
                 cache_leftpad=cache_leftpad is not None, window_size=tuple(window_size) != (-1, -1),
                 softcap=softcap > 0, alibi_slopes=alibi_slopes is not None, return_softmax_lse=return_softmax_lse)
    if k_cache.stride(-1) != 1:
        raise AssertionError("k_cache must have contiguous last dimension")
    if v_cache.stride(-1) != 1:
        raise AssertionError("v_cache must have contiguous last dimension")
    if isinstance(cache_seqlens, int):  # the Python wrapper's conversion
        cache_seqlens = torch.full((k_cache.shape[0],), cache_seqlens, dtype=torch.int32, device=k_cache.device)
    page, seqlen_k = _check_kvcache_shapes(q, k_cache, v_cache, k, v, cache_seqlens, block_table, allow_float32)
    batch, seqlen_q, _, d = q.shape
    paged = block_table is not None
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    lens = cache_seqlens.tolist() if cache_seqlens is not None else [seqlen_k] * batch
    out = torch.empty_like(q)
    for b in range(batch):
        lk = lens[b]
        if k is not None:  # append the new keys at cache_seqlens, in place
            lk = _append_to_cache(b, lk, k, v, k_cache, v_cache, block_table, page, seqlen_k)
        if not 0 <= lk <= seqlen_k:
            raise ValueError(f"sequence {b} has cache_seqlens {lk}, outside the cache's [0, {seqlen_k}] positions")
        if paged:
            kb, vb = _paged_keys(k_cache, block_table[b], lk), _paged_keys(v_cache, block_table[b], lk)
        else:
            kb, vb = k_cache[b, :lk], v_cache[b, :lk]
        out[b] = _attend(q[b], kb, vb, scale, causal and seqlen_q > 1)
    return out


def _check_kvcache_shapes(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                          allow_float32) -> tuple[int | None, int]:
    """flash-attn's checks of ``flash_attn_with_kvcache``'s tensors, with its messages; the page size (None: the
    cache is not paged) and the positions each sequence's cache holds."""
    _check_common(q, k_cache, v_cache, allow_float32, {"k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v,
                                                       "cache_seqlens": cache_seqlens, "block_table": block_table})
    batch, seqlen_q, h, d = q.shape
    _check(batch > 0, "batch size must be positive")
    hk, page = k_cache.shape[2], None
    _check(h % hk == 0, "Number of heads in key/value must divide number of heads in query")
    if block_table is not None:
        page = _check_block_table(block_table, k_cache)
        _check_shape("kcache", k_cache, (k_cache.shape[0], page, hk, d),
                     "num_blocks, page_block_size, num_heads_k, head_size_og")
        _check_shape("block_table", block_table, (batch, block_table.shape[-1]), "batch_size, max_num_blocks_per_seq")
        seqlen_k = block_table.shape[-1] * page
    else:
        seqlen_k = k_cache.shape[1]
        _check_shape("kcache", k_cache, (batch, seqlen_k, hk, d), "batch_size_c, seqlen_k, num_heads_k, head_size_og")
    _check_shape("vcache", v_cache, tuple(k_cache.shape), "same as kcache")
    if k is not None:
        _check(v is not None, "If key is supplied, value must also be passed in")
        _check(cache_seqlens is not None, "If key is supplied, seqlens_k must also be passed in")
        _check(seqlen_q <= seqlen_k, "If key is supplied, it must have seqlen <= the seqlen of the KV cache")
        _check(k.dtype == q.dtype and v.dtype == q.dtype, "Key must have the same dtype as query")
        _check_shape("k", k, (batch, k.shape[1], hk, d), "batch_size, seqlen_knew, num_heads_k, head_size_og")
        _check_shape("v", v, tuple(k.shape), "batch_size, seqlen_knew, num_heads_k, head_size_og")
    if cache_seqlens is not None:
        _check(cache_seqlens.dtype == torch.int32, "seqlens_k must have dtype int32")
        _check(cache_seqlens.is_contiguous(), "seqlens_k must be contiguous")
        _check_shape("seqlens_k", cache_seqlens, (batch,), "batch_size")
    return page, seqlen_k


def _append_to_cache(b: int, cached: int, k, v, k_cache, v_cache, block_table, page: int | None, seqlen_k: int) -> int:
    """Write sequence ``b``'s new keys and values into its cache after its ``cached`` positions (through its block
    table when paged), as the kernel does in place; its cached length after them."""
    new = k.shape[1]
    if cached + new > seqlen_k:
        raise ValueError(f"sequence {b}: {cached} cached + {new} new keys exceed the cache's {seqlen_k} positions")
    for src, cache in ((k, k_cache), (v, v_cache)):
        for i in range(new):
            pos = cached + i
            if block_table is not None:
                cache[int(block_table[b, pos // page]), pos % page] = src[b, i]
            else:
                cache[b, pos] = src[b, i]
    return cached + new


def flash_attn_varlen_func(*args, **kwargs):
    """flash-attn's ``flash_attn_varlen_func`` (fp16/bf16 only, like the kernel)."""
    return _varlen(*args, **kwargs)


def flash_attn_with_kvcache(*args, **kwargs):
    """flash-attn's ``flash_attn_with_kvcache`` (fp16/bf16 only, like the kernel)."""
    return _with_kvcache(*args, **kwargs)


def as_module(allow_float32: bool = False) -> types.ModuleType:
    """A module object that can stand in for ``flash_attn`` (``sys.modules["flash_attn"] = as_module()``)."""
    module = types.ModuleType("flash_attn", "plain-torch reference of flash-attn (kvmesh)")
    module.__version__ = "2.6.3+reference"
    module.SUPPORTED_DEVICES = SUPPORTED_DEVICES
    module.SUPPORTED_DTYPES = (*_HALF, torch.float32) if allow_float32 else _HALF
    module.PAGED_BLOCK_MULTIPLE = PAGED_BLOCK_MULTIPLE
    module.flash_attn_varlen_func = lambda *a, **kw: _varlen(*a, allow_float32=allow_float32, **kw)
    module.flash_attn_with_kvcache = lambda *a, **kw: _with_kvcache(*a, allow_float32=allow_float32, **kw)
    return module
