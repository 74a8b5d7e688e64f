"""Work folded into the attention kernel so a decoder layer launches fewer kernels (Triton device helpers).

Two launches a decode step used to make per layer, done by ``_unified_attention_kernel`` itself:

- **The rotary embedding and the K/V cache write of a decode-only step** (``rotate_rows``,
  ``write_new_kv``): every program rotates its q rows in registers; of the S split-KV programs of a
  (request, KV head), the one whose keys end at the new token (the last position, ``seq_len - 1``)
  rotates the new k and writes k and v into the cache at the token's slot, then reads them back in its
  key loop like every other key. No other program reads that position (its part of the keys ends
  before it), so nothing waits on another program. Prefill chunks keep the separate write: a chunk's
  later query blocks read the K/V its earlier tokens write.
- **The split-KV merge** (``merge_splits``): each split program stores its part's normalized output
  and log2-sum-exp2, then counts itself done on a per-(query block, KV head) counter; the last to arrive
  (``tl.atomic_add`` acq_rel: every part's stores are visible to it) weighs the parts together, writes
  the output and sets the counter back to 0 for the next launch (so a CUDA graph replays it as is).

The rotation rounds where ``triton_rotary._rotated`` (and the plain-torch reference) round, so the
folded path writes the cache bit for bit as ``rotary_and_cache`` does. A NeoX "rotate_half" head
``x = [x1 | x2]`` is rotated element-wise against its partner half:

    d <  D/2:   x[d] cos[d]       - x[d + D/2] sin[d]
    d >= D/2:   x[d] cos[d - D/2] + x[d - D/2] sin[d - D/2]          cos_sin row = [cos (D/2) | sin (D/2)]
"""

import triton
import triton.language as tl
from kvmesh.replica.triton_utils import round_fp8_casts_when_interpreting

round_fp8_casts_when_interpreting()  # the interpreter's own FP8 casts round wrongly (see there)


@triton.jit
def rotate_rows(x_row, position, cos_sin_ptr, stride_cos_sin, offs_d, mask, HALF: tl.constexpr,
                dtype: tl.constexpr):
    """x rotated to ``position`` (``dtype``): x_row points at each row's head ([R, 1] or a scalar), offs_d the
    head dims ([1, D] or [D]), position broadcasts like x_row; masked elements come back 0."""
    first = offs_d < HALF
    partner = tl.where(first, offs_d + HALF, offs_d - HALF)
    freq = tl.where(first, offs_d, offs_d - HALF)
    x = tl.load(x_row + offs_d, mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(x_row + partner, mask=mask, other=0.0).to(tl.float32)
    table = cos_sin_ptr + position.to(tl.int64) * stride_cos_sin
    cos = tl.load(table + freq, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(table + HALF + freq, mask=mask, other=0.0).to(dtype).to(tl.float32)
    x_cos = (x * cos).to(dtype).to(tl.float32)
    partner_sin = (x_partner * sin).to(dtype).to(tl.float32)
    return tl.where(first, x_cos - partner_sin, x_cos + partner_sin).to(dtype)


@triton.jit
def to_cache(x, scale_ptr, cache_ptr, KV_QUANT: tl.constexpr, FP8_MAX: tl.constexpr):
    """x as the cache stores it: an FP8 cache (KV_QUANT) takes x / scale clamped to +-FP8_MAX (kv_quant.py)."""
    if KV_QUANT:
        x = x.to(tl.float32) / tl.load(scale_ptr)
        x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
    return x.to(cache_ptr.dtype.element_ty)


@triton.jit
def cache_scale(scale_ptr, KV_QUANT: tl.constexpr):
    """An FP8 cache's scale (one float32, read once per program); 1.0 for a cache in the model's dtype."""
    if KV_QUANT:
        return tl.load(scale_ptr)
    return 1.0


@triton.jit
def from_cache(x, scale, dtype: tl.constexpr, KV_QUANT: tl.constexpr):
    """x as loaded from the cache, in the model's ``dtype``: an FP8 cache's x times its ``scale``."""
    if KV_QUANT:
        x = (x.to(tl.float32) * scale).to(dtype)
    return x


@triton.jit
def write_new_kv(token, kv_head, new_k_ptr, new_v_ptr, positions_ptr, slot_mapping_ptr, cos_sin_ptr,
                 k_cache_ptr, v_cache_ptr, stride_nk_tok, stride_nk_head, stride_nv_tok, stride_nv_head,
                 stride_cos_sin, stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot,
                 stride_v_head, offs_d, d_ok, k_scale_ptr, v_scale_ptr, BLOCK_SIZE: tl.constexpr,
                 HALF: tl.constexpr, KV_QUANT: tl.constexpr, FP8_MAX: tl.constexpr):
    """Rotate ``token``'s k of ``kv_head`` and write it and its v into the cache at the token's slot (an FP8
    cache: through k_scale/v_scale)."""
    token = token.to(tl.int64)
    position = tl.load(positions_ptr + token)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    k = rotate_rows(new_k_ptr + token * stride_nk_tok + kv_head * stride_nk_head, position, cos_sin_ptr,
                    stride_cos_sin, offs_d, d_ok, HALF, new_k_ptr.dtype.element_ty)  # [HEAD_DIM_PADDED]
    v = tl.load(new_v_ptr + token * stride_nv_tok + kv_head * stride_nv_head + offs_d, mask=d_ok)
    k = to_cache(k, k_scale_ptr, k_cache_ptr, KV_QUANT, FP8_MAX)
    v = to_cache(v, v_scale_ptr, v_cache_ptr, KV_QUANT, FP8_MAX)
    tl.store(k_cache_ptr + block * stride_k_block + offset * stride_k_slot + kv_head * stride_k_head + offs_d, k,
             mask=d_ok)
    tl.store(v_cache_ptr + block * stride_v_block + offset * stride_v_slot + kv_head * stride_v_head + offs_d, v,
             mask=d_ok)


@triton.jit
def merge_splits(acc, m_i, l_i, partial_ptr, lse_ptr, counter_ptr, out_ptr, q_start, q_len, local, kv_head,
                 split, num_heads, stride_o_tok, stride_o_head, offs_d, d_ok, HEAD_DIM: tl.constexpr,
                 NUM_SPLITS: tl.constexpr, SPLITS_PADDED: tl.constexpr, G: tl.constexpr, BLOCK_Q: tl.constexpr,
                 BLOCK_M: tl.constexpr, MERGE_ROWS: tl.constexpr):
    """Store this split's part (acc [BLOCK_M, D] normalized, its log2-sum-exp2 from m_i, l_i); the last of the
    query block's splits to arrive merges every part into out, MERGE_ROWS tile rows at a time (a prefill
    tile's 64 rows at once would double the kernel's registers). ``counter_ptr``: this (query block, KV
    head)'s counter, 0 when the launch starts. Tile rows m = q * G + g, as in the attention kernel."""
    offs_m = tl.arange(0, BLOCK_M)
    q_idx = local * BLOCK_Q + offs_m // G
    row_ok = (offs_m // G < BLOCK_Q) & (q_idx < q_len)
    rows = ((q_start + q_idx).to(tl.int64) * num_heads + kv_head * G + offs_m % G) * NUM_SPLITS + split  # [BLOCK_M]
    mask = row_ok[:, None] & d_ok[None, :]
    tl.store(partial_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=mask)
    lse = tl.where(l_i > 0.0, m_i + tl.math.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    tl.debug_barrier()  # every thread's part is stored before the count says this split is done
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if arrived == NUM_SPLITS - 1:
        tl.store(counter_ptr, 0)  # ready for the next launch (or replay)
        offs_s = tl.arange(0, SPLITS_PADDED)
        for first in range(0, BLOCK_M, MERGE_ROWS):
            sub = first + tl.arange(0, MERGE_ROWS)
            sub_q = local * BLOCK_Q + sub // G
            ok = (sub // G < BLOCK_Q) & (sub_q < q_len)
            tok, head = (q_start + sub_q).to(tl.int64), kv_head * G + sub % G
            base = (tok * num_heads + head) * NUM_SPLITS  # [MERGE_ROWS] split 0's part row
            lse_all = tl.load(lse_ptr + base[:, None] + offs_s[None, :],
                              mask=ok[:, None] & (offs_s < NUM_SPLITS)[None, :],
                              other=float("-inf"), cache_modifier=".cg")  # [MERGE_ROWS, SPLITS_PADDED]
            lse_max = tl.max(lse_all, 1)
            lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # padding rows: no part has a key
            sub_mask = ok[:, None] & d_ok[None, :]
            out = tl.zeros([MERGE_ROWS, offs_d.shape[0]], tl.float32)
            total = tl.zeros([MERGE_ROWS], tl.float32)
            for s in range(NUM_SPLITS):
                weight = tl.math.exp2(tl.load(lse_ptr + base + s, mask=ok, other=float("-inf"),
                                              cache_modifier=".cg") - lse_max)  # [MERGE_ROWS], 0: an empty part
                part = tl.load(partial_ptr + (base + s)[:, None] * HEAD_DIM + offs_d[None, :], mask=sub_mask,
                               other=0.0, cache_modifier=".cg")  # [MERGE_ROWS, HEAD_DIM_PADDED]
                out += weight[:, None] * part
                total += weight
            out = out / tl.where(total == 0.0, 1.0, total)[:, None]
            o_rows = tok * stride_o_tok + head * stride_o_head
            tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=sub_mask)
