"""Compile the attention kernels (paged attention, split merge, cache write) to GPU machine code without a GPU (run as a script, in a process
without TRITON_INTERPRET: the interpreter replaces triton.jit for the whole process).

Triton lowers to PTX and runs its bundled ptxas for a named target, so a kernel that would not
compile on an H100/A100 fails on any CI machine. Prints one line per configuration; exits non-zero
on the first failure.
"""

from __future__ import annotations

import sys

import triton
from kvmesh.replica.attention import triton_paged_attention as tpa
from kvmesh.replica.attention import triton_reshape_and_cache as trc
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

POINTERS = ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")
INDEX_POINTERS = ("block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr")
STRIDES = ("stride_q_tok", "stride_q_head", "stride_o_tok", "stride_o_head", "stride_k_block", "stride_k_slot",
           "stride_k_head", "stride_v_block", "stride_v_slot", "stride_v_head", "stride_bt")
# (data type, query heads per KV head, head dim, block size, longest query run, KV splits, compute capability,
# one request); one request: Triton's JIT turns an int argument equal to 1 into a constant (a batch of one)
CONFIGS = (("bf16", 4, 128, 16, 512, 1, 90, False), ("bf16", 4, 128, 16, 1, 16, 90, True),
           ("fp16", 3, 24, 32, 1, 3, 80, False), ("fp32", 1, 64, 16, 100, 1, 80, False))


def compile_one(dtype: str, queries_per_kv: int, head_dim: int, block_size: int, max_query_len: int, splits: int,
                capability: int, one_request: bool):
    block_q, block_m = tpa.tile_shape(queries_per_kv, max_query_len)
    constants = dict(BLOCK_SIZE=block_size, NUM_QUERIES_PER_KV=queries_per_kv, HEAD_DIM=head_dim,
                     HEAD_DIM_PADDED=max(16, triton.next_power_of_2(head_dim)), BLOCK_Q=block_q, BLOCK_M=block_m,
                     TILE=tpa.TILE_N, INPUT_PRECISION="ieee" if dtype == "fp32" else "tf32", NUM_SPLITS=splits)
    signature = {**{p: f"*{dtype}" for p in POINTERS}, "partial_ptr": "*fp32", "lse_ptr": "*fp32",
                 **{p: "*i32" for p in INDEX_POINTERS}, "scale": "fp32", "num_reqs": "i32", "num_heads": "i32",
                 **{s: "i32" for s in STRIDES}, **{c: "constexpr" for c in constants}}
    if one_request:
        signature["num_reqs"], constants = "constexpr", {**constants, "num_reqs": 1}
    kernels = [triton.compile(ASTSource(tpa._unified_attention_kernel, signature, constexprs=constants),
                              target=GPUTarget("cuda", capability, 32))]
    if splits > 1:
        merge = dict(NUM_SPLITS=splits, SPLITS_PADDED=triton.next_power_of_2(splits), HEAD_DIM=head_dim,
                     HEAD_DIM_PADDED=constants["HEAD_DIM_PADDED"])
        merge_signature = {"partial_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": f"*{dtype}", "num_heads": "i32",
                           "stride_o_tok": "i32", "stride_o_head": "i32", **{c: "constexpr" for c in merge}}
        kernels.append(triton.compile(ASTSource(tpa._merge_splits_kernel, merge_signature, constexprs=merge),
                                      target=GPUTarget("cuda", capability, 32)))
    num_kv_heads = 2
    write = dict(BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEADS_X_DIM=num_kv_heads * head_dim,
                 HD_PADDED=triton.next_power_of_2(num_kv_heads * head_dim), TOKENS=trc.BLOCK_T)
    write_signature = {**{p: f"*{dtype}" for p in ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr")},
                       "slot_mapping_ptr": "*i64", "num_tokens": "i32",
                       **{s: "i32" for s in ("stride_k_tok", "stride_k_head", "stride_v_tok", "stride_v_head",
                                             "stride_kc_block", "stride_kc_slot", "stride_kc_head", "stride_vc_block",
                                             "stride_vc_slot", "stride_vc_head")}, **{c: "constexpr" for c in write}}
    kernels.append(triton.compile(ASTSource(trc._reshape_and_cache_kernel, write_signature, constexprs=write),
                                  target=GPUTarget("cuda", capability, 32)))
    return kernels


def main() -> int:
    for config in CONFIGS:
        for kernel in compile_one(*config):
            assert kernel.asm.get("cubin"), f"no cubin for {config}"
            print("compiled", kernel.name, config, "shared memory", kernel.metadata.shared)
    return 0


if __name__ == "__main__":
    sys.exit(main())
