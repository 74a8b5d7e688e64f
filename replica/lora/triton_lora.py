"""The Triton kernels of the gathered LoRA update (punica's SGMV shape): one segment GEMM, run twice per layer.

    shrink   buf[t, :]  = x[t, :] @ A[slot(req(t))].T        x [T, in], A [S, R, in]   -> buf [T, R] fp32
    expand   y[t, :]   += buf[t, :] @ B[slot(req(t))].T      B [S, out, R]             -> y [T, out]

A program owns (one request's segment of at most BLOCK_M tokens, BLOCK_N output columns): the request's slot is
one scalar load, so its tokens share one weight tile and the dot is a real matrix product; requests of the base
model (slot -1) do nothing (their loads and stores are masked off). Grid sizes come from host facts (requests,
longest query) -- no sync. Both dots accumulate in fp32 with IEEE precision (no TF32); the expand reads the fp32
buffer in B's dtype (a bf16 model's update goes through the tensor cores; an fp32 model's stays fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvmesh.replica.triton_utils import widen_bf16_dots_when_interpreting

widen_bf16_dots_when_interpreting()  # the interpreter's own tl.dot misreads bf16 (triton_utils.py)

BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 32


@triton.jit
def _lora_segment_gemm(x_ptr, w_ptr, out_ptr, qsl_ptr, slots_ptr, N, K,
                       stride_xm, stride_xk, stride_ws, stride_wn, stride_wk, stride_om, stride_on,
                       ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    req = tl.program_id(0)
    slot = tl.load(slots_ptr + req)
    start = tl.load(qsl_ptr + req)
    end = tl.load(qsl_ptr + req + 1)
    end = tl.where(slot >= 0, end, start)  # the base model's requests: every row masked off
    slot = tl.maximum(slot, 0).to(tl.int64)
    rows = start + tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] token indices
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output columns
    row_ok = rows < end
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = w_ptr + slot * stride_ws
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :] * stride_xk,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None] * stride_wk,
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
        if x.dtype != w.dtype:  # expand: the fp32 buffer cast to B's dtype (as vLLM's expand), so a bf16 B runs
            x = x.to(w.dtype)   # on the tensor cores (mma) with fp32 accumulation, not on fp32 FMAs
        acc = tl.dot(x, w, acc, out_dtype=tl.float32, input_precision="ieee")
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on
    mask = row_ok[:, None] & col_ok[None, :]
    if ACCUMULATE:
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def segment_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, query_start_loc: torch.Tensor,
                 req_slots: torch.Tensor, num_reqs: int, max_query_len: int, accumulate: bool) -> None:
    """``out[seg(r)] (+)= x[seg(r)] @ w[req_slots[r]].T`` for every request r with a slot (>= 0).

    x [T, K], w [S, N, K], out [T, N]; query_start_loc [num_reqs + 1] int32, req_slots [num_reqs] int32."""
    n, k = w.shape[1], w.shape[2]
    grid = (num_reqs, triton.cdiv(max_query_len, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _lora_segment_gemm[grid](x, w, out, query_start_loc, req_slots, n, k,
                             x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2),
                             out.stride(0), out.stride(1), ACCUMULATE=accumulate, BLOCK_M=BLOCK_M,
                             BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)


def lora_update_triton(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       query_start_loc: torch.Tensor, req_slots: torch.Tensor, num_reqs: int,
                       max_query_len: int) -> None:
    """y [T, out] += (x [T, in] @ A[slot].T) @ B[slot].T per request; A [S, R, in], B [S, out, R]."""
    buf = torch.empty(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)  # [T, R]
    segment_gemm(x, a, buf, query_start_loc, req_slots, num_reqs, max_query_len, accumulate=False)
    segment_gemm(buf, b, y, query_start_loc, req_slots, num_reqs, max_query_len, accumulate=True)
