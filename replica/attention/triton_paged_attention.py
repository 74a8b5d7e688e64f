"""One Triton kernel for prefill and decode over the paged KV cache (vLLM's unified attention).

A step's queries are cut into query blocks of ``BLOCK_Q`` consecutive tokens of one request; a
program attends one query block for one KV head, so its tile holds the ``G = Hq // Hk`` query
heads that share the head (GQA) -- rows ``m = q * G + g``:

    tile [BLOCK_M = BLOCK_Q * G (padded), HEAD_DIM_PADDED]     rows: (query token q, head kv_head * G + g)
    grid (num_tokens // BLOCK_Q + num_reqs, Hk, S)              an upper bound on query blocks, known on
                                                                the host without a sync; spare programs exit;
                                                                S parts per context (split-KV, below)

Query block b belongs to request r = the last one with ``query_start_loc[r] // BLOCK_Q + r <= b``
(a binary search in the kernel: request r's blocks start at that index). The program walks the
request's keys in tiles of ``TILE_N`` positions, reading each key's block id from the block table
(so any block size works and nothing is gathered), with an online softmax in fp32:

    position p of request r  ->  cache row  block_table[r, p // BLOCK_SIZE], offset p % BLOCK_SIZE
    query token i of a run of n (context ctx = seq_len - n) is at position ctx + i, sees keys <= ctx + i

A decode-only step of B rows launches (B // BLOCK_Q + B, Hk, S) programs over tensors of fixed shape
per B: what a CUDA graph captures. S > 1 (split-KV, as SGLang's decode kernel) cuts each query
block's keys into S parts of whole tiles; each program writes its part's normalized output and
log-sum-exp, and the last of the S to finish weighs them together in the same launch -- for steps
whose working programs alone would leave most SMs idle: small decode batches, and short suffixes over
long cached prefixes (16 tokens over 2k: 2 query blocks x 4 KV heads = 8 programs, 128 with S = 16).
``num_kv_splits`` sizes S from the device's SM count. A decode-only step also rotates q and writes the
new tokens' K/V in this launch (``new_kv``); both folds are in triton_attention_folds.py.

Both dots take the cache's dtype as operands and accumulate in fp32 (vLLM's unified attention, the
flash kernels): Q @ K^T reads bf16/fp16 Q and K as loaded, P @ V rounds the fp32 probabilities to
V's dtype. On an H100 that is ``wgmma``/``mma.sync`` bf16 -- twice the tensor-core rate of TF32 and
half the shared memory of fp32 operands. The softmax statistics, the accumulator and the split-KV
partials stay fp32. fp32 inputs (tests, CPU) take IEEE dots: nothing here runs in TF32.
"""

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from kvmesh.replica.attention.kv_quant import kernel_scales
from kvmesh.replica.attention.triton_attention_folds import (
    cache_scale,
    from_cache,
    merge_splits,
    rotate_rows,
    write_new_kv,
)
from kvmesh.replica.triton_utils import widen_bf16_dots_when_interpreting

widen_bf16_dots_when_interpreting()  # the interpreter's own tl.dot misreads bf16 (see there)

TILE_N = 32  # key positions per inner-loop step
MIN_BLOCK_M = 16  # tl.dot needs at least 16 rows; the tile of decode steps and short chunks
PREFILL_BLOCK_M = 64  # tile rows once a query run fills more than MIN_BLOCK_M: K/V read once per 64 rows
MAX_KV_SPLITS = 32  # most parts split-KV cuts a context into (B=1 on an H100: 4 KV heads x 32 = 128 of 132 SMs)
MIN_SPLIT_KEYS = 128  # fewest keys per part when a step with longer query runs splits (4 tiles)


STEP_VARYING = ("counter_ptr", "block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr", "num_reqs", "stride_bt",
                "positions_ptr", "slot_mapping_ptr")
"""Arguments that change from step to step in ways Triton would otherwise compile a kernel for each of (an int
equal to 1 or a multiple of 16, an index array's 16-byte alignment in the step's packed upload): not
specialized on, so the specializations a server meets are the few worker/kernel_warmup.py compiles at
start-up. They are scalars and gathered indices: alignment buys these loads nothing."""


@triton.jit(do_not_specialize=STEP_VARYING)
def _unified_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, partial_ptr, lse_ptr, counter_ptr, block_table_ptr, seq_lens_ptr,
        query_start_loc_ptr, scale, num_reqs, num_heads,
        stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
        stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot, stride_v_head,
        stride_bt,
        new_k_ptr, new_v_ptr, positions_ptr, slot_mapping_ptr, cos_sin_ptr,
        stride_nk_tok, stride_nk_head, stride_nv_tok, stride_nv_head, stride_cos_sin, k_scale_ptr, v_scale_ptr,
        BLOCK_SIZE: tl.constexpr, NUM_QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
        HEAD_DIM_PADDED: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, TILE: tl.constexpr,
        NUM_SPLITS: tl.constexpr, SPLITS_PADDED: tl.constexpr, MERGE_ROWS: tl.constexpr, DECODE_WRITE: tl.constexpr,
        HALF: tl.constexpr, KV_QUANT: tl.constexpr, FP8_MAX: tl.constexpr):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # the request this query block belongs to: binary search over query_start_loc
    lo = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    req = lo - 1
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    local = q_block - (q_start // BLOCK_Q + req)  # this program's query block within the request
    if local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    offs_n = tl.arange(0, TILE)
    q_idx = local * BLOCK_Q + offs_m // NUM_QUERIES_PER_KV  # [BLOCK_M] query token within the run
    head = kv_head * NUM_QUERIES_PER_KV + offs_m % NUM_QUERIES_PER_KV  # [BLOCK_M] query head
    row_ok = (offs_m // NUM_QUERIES_PER_KV < BLOCK_Q) & (q_idx < q_len)
    d_ok = offs_d < HEAD_DIM
    q_rows = (q_start + q_idx).to(tl.int64) * stride_q_tok + head * stride_q_head
    q_pos = ctx + q_idx  # [BLOCK_M] absolute position of each row's token
    if DECODE_WRITE:  # a decode-only step: q rotated here (triton_attention_folds.py)
        rope_pos = tl.load(positions_ptr + q_start + q_idx, mask=row_ok, other=0)  # [BLOCK_M]
        q = rotate_rows((q_ptr + q_rows)[:, None], rope_pos[:, None], cos_sin_ptr, stride_cos_sin, offs_d[None, :],
                        row_ok[:, None] & d_ok[None, :], HALF, q_ptr.dtype.element_ty)
    else:
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)  # [BLOCK_M, HEAD_DIM_PADDED], the model's dtype

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scaled scores
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)  # running sum of exp(score - m_i)
    acc = tl.full([BLOCK_M, HEAD_DIM_PADDED], 0.0, tl.float32)
    qk_scale = scale * 1.4426950408889634  # scores in log2 units: exp2 instead of exp
    kv_end = tl.minimum(seq_len, ctx + (local + 1) * BLOCK_Q)  # keys the block's last query sees
    split_len = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), TILE) * TILE  # whole tiles; >= kv_end when unsplit
    kv_lo = split * split_len
    kv_hi = tl.minimum(kv_end, kv_lo + split_len)  # this program's keys: [kv_lo, kv_hi), maybe none
    if DECODE_WRITE:  # noqa: SIM102 -- a compile-time branch: the split test exists only in decode kernels
        if split == (seq_len - 1) // split_len:  # the part whose keys end at the new token writes its K/V
            write_new_kv(q_start, kv_head, new_k_ptr, new_v_ptr, positions_ptr, slot_mapping_ptr, cos_sin_ptr,
                         k_cache_ptr, v_cache_ptr, stride_nk_tok, stride_nk_head, stride_nv_tok, stride_nv_head,
                         stride_cos_sin, stride_k_block, stride_k_slot, stride_k_head, stride_v_block,
                         stride_v_slot, stride_v_head, offs_d, d_ok, k_scale_ptr, v_scale_ptr, BLOCK_SIZE, HALF,
                         KV_QUANT, FP8_MAX)
            tl.debug_barrier()  # written before any thread of the program reads it back below
    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt
    k_scale, v_scale = cache_scale(k_scale_ptr, KV_QUANT), cache_scale(v_scale_ptr, KV_QUANT)
    for start in range(kv_lo, kv_hi, TILE):
        pos = start + offs_n  # [TILE] key positions
        n_ok = pos < kv_hi
        block = tl.load(bt_row + pos // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        k_off = block * stride_k_block + slot * stride_k_slot + kv_head * stride_k_head  # [TILE]
        k = tl.load(k_cache_ptr + k_off[None, :] + offs_d[:, None], mask=d_ok[:, None] & n_ok[None, :],
                    other=0.0)  # [HEAD_DIM_PADDED, TILE]
        k = from_cache(k, k_scale, q.dtype, KV_QUANT)  # an FP8 cache: dequantized to q's dtype
        s = tl.dot(q, k, out_dtype=tl.float32, input_precision="ieee") * qk_scale  # [BLOCK_M, TILE] fp32
        s = tl.where((pos[None, :] <= q_pos[:, None]) & n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet (padding rows)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = block * stride_v_block + slot * stride_v_slot + kv_head * stride_v_head
        v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :],
                    other=0.0)  # [TILE, HEAD_DIM_PADDED]
        v = from_cache(v, v_scale, q.dtype, KV_QUANT)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], out_dtype=tl.float32, input_precision="ieee")
        m_i = m_new
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if NUM_SPLITS == 1:
        o_rows = (q_start + q_idx).to(tl.int64) * stride_o_tok + head * stride_o_head  # [BLOCK_M]
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
    else:  # this split's part; the last of the query block's splits to finish merges them
        merge_splits(acc, m_i, l_i, partial_ptr, lse_ptr, counter_ptr + q_block * tl.num_programs(1) + kv_head,
                     out_ptr, q_start, q_len, local, kv_head, split, num_heads, stride_o_tok, stride_o_head,
                     offs_d, d_ok, HEAD_DIM, NUM_SPLITS, SPLITS_PADDED, NUM_QUERIES_PER_KV, BLOCK_Q, BLOCK_M,
                     MERGE_ROWS)


def tile_shape(num_queries_per_kv: int, max_query_len: int) -> tuple[int, int]:
    """(BLOCK_Q, BLOCK_M): query tokens per program and tile rows (BLOCK_Q * G padded to a power of two).
    Decode steps (and runs short enough for 16 rows) take 16-row tiles; longer prefill runs 64-row
    tiles, so each K/V tile read from the cache serves 4x the queries."""
    rows = max_query_len * num_queries_per_kv
    block_m = MIN_BLOCK_M if rows <= MIN_BLOCK_M else PREFILL_BLOCK_M
    block_m = max(block_m, triton.next_power_of_2(num_queries_per_kv))
    return block_m // num_queries_per_kv, block_m


def num_kv_splits(programs: int, device: torch.device, longest_context: int | None = None) -> int:
    """How many parts to split each context into so that ``programs`` (query blocks x KV heads doing work)
    fill the device's SMs: 1 when they already do, or off CUDA. Host arithmetic only.

    Decode-only steps pass ``decode_programs`` and no context: their split depends on the batch alone,
    so an eager step and the CUDA graph it would be padded to split alike (a short context just leaves
    most parts empty). Other steps -- a short suffix over a long cached prefix is the case that matters
    -- pass their longest context, and each part keeps at least ``MIN_SPLIT_KEYS`` keys."""
    sms = num_sms(device)
    if programs >= sms:
        return 1
    splits = min(MAX_KV_SPLITS, triton.next_power_of_2(triton.cdiv(sms, programs)))
    if longest_context is not None:
        splits = min(splits, 1 << max(0, (longest_context // MIN_SPLIT_KEYS).bit_length() - 1))
    return splits


def decode_programs(num_reqs: int, num_kv_heads: int) -> int:
    """Working programs of a decode-only step, B rounded up to a power of two (every power of two is a
    CUDA-graph capture size)."""
    return triton.next_power_of_2(num_reqs) * num_kv_heads


def step_programs(query_start_loc_cpu: list[int], num_queries_per_kv: int, max_query_len: int,
                  num_kv_heads: int) -> int:
    """Working programs of any step: each request's query blocks, per KV head."""
    block_q, _ = tile_shape(num_queries_per_kv, max_query_len)
    starts = query_start_loc_cpu
    blocks = sum(-(-(starts[r + 1] - starts[r]) // block_q) for r in range(len(starts) - 1))
    return blocks * num_kv_heads


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 elsewhere (nothing to fill)."""
    return _cuda_sms(device.index) if device.type == "cuda" else 0


@functools.cache
def _cuda_sms(device_index: int | None) -> int:
    return torch.cuda.get_device_properties(device_index or 0).multi_processor_count


class NewTokenKV(NamedTuple):
    """A decode-only step's new tokens, not yet rotated nor in the cache: the kernel does both."""

    k: torch.Tensor
    """[T, Hk, Dh] keys before the rotary embedding (q, too, comes unrotated)."""
    v: torch.Tensor
    """[T, Hk, Dh] values."""
    positions: torch.Tensor
    """[T] position of every token (the rotary angle)."""
    slot_mapping: torch.Tensor
    """[T] int64 cache slot of every token."""
    cos_sin_cache: torch.Tensor
    """[max_position, Dh] the rotary table: [cos | sin] per position."""


def split_counters(num_tokens: int, num_reqs: int, num_kv_heads: int, block_q: int,
                   device: torch.device) -> torch.Tensor:
    """Zeroed arrival counters of a split launch, one per (query block, KV head) program column."""
    return torch.zeros((num_tokens // block_q + num_reqs) * num_kv_heads, dtype=torch.int32, device=device)


def unified_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                      query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                      scale: float, max_query_len: int, num_splits: int = 1, new_kv: NewTokenKV | None = None,
                      counters: torch.Tensor | None = None,
                      kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attend q [T, Hq, Dh] over the paged cache k_cache/v_cache [num_blocks, block_size, Hk, Dh] into
    out [T, Hq, Dh]. query_start_loc [R + 1] int32, seq_lens [R] int32 (context + query), block_table
    [R, max_blocks] int32; max_query_len (host) picks the tile. The step's own K/V must already be in
    the cache, except in a decode-only step given ``new_kv``: then q is unrotated and the kernel rotates
    q, and rotates and writes the new K/V itself (triton_attention_folds.py).

    With ``num_splits`` > 1 each context is cut into that many parts attended by separate programs, the
    last of which merges them (split-KV: for steps too small to fill the GPU); ``counters`` (int32, at
    least ``split_counters``'s size, zero, left zero) count the parts done -- allocated here when None.
    Launch shapes come from q's shape, R and num_splits only, so nothing is read back from the device. An FP8
    cache (``kv_scales`` = (k_scale, v_scale), one-element float32 tensors) is dequantized as it is loaded."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and q.stride(-1) == 1 and out.stride(-1) == 1
    num_reqs = seq_lens.shape[0]
    queries_per_kv = num_heads // num_kv_heads
    block_q, block_m = tile_shape(queries_per_kv, max_query_len)
    head_dim_padded = max(16, triton.next_power_of_2(head_dim))
    partial = lse = out  # unused unless split
    if num_splits > 1:
        partial = torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=q.device)
        if counters is None:
            counters = split_counters(num_tokens, num_reqs, num_kv_heads, block_q, q.device)
    else:
        counters = out  # unused
    if new_kv is None:
        k = v = positions = slots = cos_sin = out  # unused
    else:
        assert max_query_len == 1 and head_dim % 2 == 0, "new_kv is for decode-only steps with an even head_dim"
        k, v, positions, slots, cos_sin = new_kv
        assert k.stride(-1) == 1 and v.stride(-1) == 1 and cos_sin.stride(-1) == 1
    k_scale, v_scale, kv_quant, fp8_max = kernel_scales(kv_scales, k_cache, out)
    grid = (num_tokens // block_q + num_reqs, num_kv_heads, num_splits)
    _unified_attention_kernel[grid](
        q, k_cache, v_cache, out, partial, lse, counters, block_table, seq_lens, query_start_loc, scale, num_reqs,
        num_heads, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), block_table.stride(0), k, v, positions, slots, cos_sin,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos_sin.stride(0), k_scale, v_scale,
        BLOCK_SIZE=block_size, NUM_QUERIES_PER_KV=queries_per_kv, HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=head_dim_padded, BLOCK_Q=block_q, BLOCK_M=block_m, TILE=TILE_N, NUM_SPLITS=num_splits,
        SPLITS_PADDED=triton.next_power_of_2(num_splits), MERGE_ROWS=MIN_BLOCK_M, DECODE_WRITE=new_kv is not None,
        HALF=head_dim // 2,
        KV_QUANT=kv_quant, FP8_MAX=fp8_max)
    return out
