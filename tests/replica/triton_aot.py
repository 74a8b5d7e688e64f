"""Compile every kvmesh Triton kernel for a GPU without one, through the project's own wrappers.

Run as a script in a process without TRITON_INTERPRET (the interpreter replaces triton.jit for the
whole process): ``python tests/replica/triton_aot.py [--dump DIR]``. A stand-in driver reports the
case's target (sm_90 = H100, sm_80 = A100) and each launch compiles with the JIT's real
specializations (alignment, ``== 1`` constants) but never runs; Triton's bundled ptxas assembles
the PTX and its cuobjdump reads registers, stack and spills (local memory) from the cubin.

Prints one JSON line per (case, kernel): target, grid, warps, stages, registers, spills, shared
memory, the occupancy an H100 SM gives it and what limits it, and the MMA instructions in the PTX
(``mma.sync ... bf16`` / ``wgmma ... bf16`` vs ``... tf32``). Cases: the 1.1B TinyLlama shape
(hidden 2048, 32 query heads, 4 KV heads, head dim 64, block 16, bf16) at decode batch 1/64/256, a
512-token prefill chunk, a 16-token suffix over a 2,048-token cached prefix and the fused layers at
1/256/512 tokens, and an FP8 KV cache (E4M3 at decode batch 1/64 and the prefill chunk, E5M2 at batch 64: the
``cvt`` instructions that pack and unpack FP8 listed per kernel); then odd shapes on an A100 (fp16 with 3 query heads
per KV head and head dim 24,
fp32). tests/replica/test_triton_aot.py checks the rows; BENCHMARKS.md has the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

H100_SMS = 132
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, BLOCK = 2048, 32, 4, 64, 5632, 16  # TinyLlama 1.1B


class StandInDriver:
    """Reports a CUDA target of ``capability``; the device index is the capability, so each target
    gets its own JIT cache."""

    capability = 90

    def get_current_target(self):
        return GPUTarget("cuda", self.capability, 32)

    def get_current_device(self):
        return self.capability

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty):
        return ty


COMPILED: list[tuple[str, tuple, object]] = []


def compile_instead_of_running() -> None:
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        COMPILED.append((self.fn.__name__, tuple(grid(None) if callable(grid) else grid), kernel))
        return kernel

    JITFunction.run = compile_only


def attention_case(dtype: torch.dtype, hq: int, hk: int, dh: int, block_size: int, query_lens: list[int],
                   context: int, rotary: bool = True, kv_dtype: torch.dtype | None = None) -> Callable[[], None]:
    """A step of requests with ``query_lens`` new tokens over ``context`` cached ones, through the
    backend's own build (its split-KV decision at the stand-in's SM count) and forward; ``rotary``: the
    rotary embedding folded into the cache write (the model's path), else the plain write; ``kv_dtype``: an
    FP8 cache of that type, written and read through per-layer scales."""
    from kvmesh.replica.attention.metadata import CommonAttentionMetadata
    from kvmesh.replica.attention.triton_backend import TritonAttentionBackend

    def run() -> None:
        t, r = sum(query_lens), len(query_lens)
        width = -(-(context + max(query_lens)) // block_size)
        qkv = torch.zeros(t, (hq + 2 * hk) * dh, dtype=dtype)  # [T, (Hq + 2 Hk) Dh], q/k/v are views
        q, k, v = qkv.split([hq * dh, hk * dh, hk * dh], dim=1)
        cu = [0]
        for n in query_lens:
            cu.append(cu[-1] + n)
        lens = [context + n for n in query_lens]
        common = CommonAttentionMetadata(
            num_reqs=r, num_decodes=r if max(query_lens) == 1 else 0, num_actual_tokens=t,
            max_query_len=max(query_lens), max_seq_len=max(lens), block_size=block_size,
            query_start_loc=torch.tensor(cu, dtype=torch.int32), seq_lens=torch.tensor(lens, dtype=torch.int32),
            block_tables=torch.zeros(r, width, dtype=torch.int32), slot_mapping=torch.zeros(t, dtype=torch.int64),
            query_start_loc_cpu=cu, seq_lens_cpu=lens)
        backend = TritonAttentionBackend()
        cache = torch.zeros(backend.kv_cache_shape(64, block_size, hk, dh), dtype=kv_dtype or dtype, device="cpu")
        rope = (torch.zeros(t, dtype=torch.int64), torch.zeros(4096, dh, dtype=dtype)) if rotary else None
        scales = {} if kv_dtype is None else {"kv_scales": (torch.ones(1), torch.ones(1))}
        backend.forward(q.view(t, hq, dh), k.view(t, hk, dh), v.view(t, hk, dh), cache, backend.build(common),
                        dh ** -0.5, rope, **scales)

    return run


def layers_case(tokens: int, dtype: torch.dtype = torch.bfloat16) -> Callable[[], None]:
    from kvmesh.replica.layers import triton_activation, triton_layernorm, triton_rotary

    def run() -> None:
        x, w = torch.zeros(tokens, HIDDEN, dtype=dtype), torch.ones(HIDDEN, dtype=dtype)
        triton_layernorm.rms_norm(x, w, 1e-5)
        triton_layernorm.fused_add_rms_norm(x, x.clone(), w, 1e-5)
        qkv = torch.zeros(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype)
        q = qkv[:, : HEADS * HEAD_DIM].view(tokens, HEADS, HEAD_DIM)
        k = qkv[:, HEADS * HEAD_DIM: (HEADS + KV_HEADS) * HEAD_DIM].view(tokens, KV_HEADS, HEAD_DIM)
        triton_rotary.rotary_embedding(torch.zeros(tokens, dtype=torch.int64), q, k,
                                       torch.zeros(2048, HEAD_DIM, dtype=dtype))
        triton_activation.silu_and_mul(torch.zeros(tokens, 2 * INTERMEDIATE, dtype=dtype))

    return run


def lora_case(tokens: int, query_len: int, rank: int = 16, slots: int = 4,
              dtype: torch.dtype = torch.bfloat16) -> Callable[[], None]:
    """The gathered LoRA update of the qkv projection (shrink, then expand) for ``tokens`` tokens in requests of
    ``query_len``, every request on an adapter slot."""
    from kvmesh.replica.lora.triton_lora import lora_update_triton

    def run() -> None:
        out = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        reqs = tokens // query_len
        x, y = torch.zeros(tokens, HIDDEN, dtype=dtype), torch.zeros(tokens, out, dtype=dtype)
        a, b = torch.zeros(slots, rank, HIDDEN, dtype=dtype), torch.zeros(slots, out, rank, dtype=dtype)
        qsl = torch.arange(0, tokens + 1, query_len, dtype=torch.int32)
        lora_update_triton(y, x, a, b, qsl, torch.zeros(reqs, dtype=torch.int32), reqs, query_len)

    return run


def cases() -> list[tuple[str, int, Callable[[], None]]]:
    """(label, compute capability, what to launch)."""
    bf16 = dict(dtype=torch.bfloat16, hq=HEADS, hk=KV_HEADS, dh=HEAD_DIM, block_size=BLOCK)
    fp8 = dict(bf16, kv_dtype=torch.float8_e4m3fn)
    return [
        ("decode B=1", 90, attention_case(**bf16, query_lens=[1], context=1023)),
        ("decode B=64", 90, attention_case(**bf16, query_lens=[1] * 64, context=1023)),
        ("decode B=256", 90, attention_case(**bf16, query_lens=[1] * 256, context=1023)),
        ("prefill 512-token chunk", 90, attention_case(**bf16, query_lens=[512], context=512)),
        ("16-token suffix over 2k cached", 90, attention_case(**bf16, query_lens=[16], context=2048)),
        ("layers T=1", 90, layers_case(1)),
        ("layers T=256", 90, layers_case(256)),
        ("layers T=512", 90, layers_case(512)),
        ("LoRA decode B=64", 90, lora_case(64, 1)),
        ("LoRA prefill 512-token chunk", 90, lora_case(512, 512)),
        ("FP8 decode B=1", 90, attention_case(**fp8, query_lens=[1], context=1023)),
        ("FP8 decode B=64", 90, attention_case(**fp8, query_lens=[1] * 64, context=1023)),
        ("FP8 prefill 512-token chunk", 90, attention_case(**fp8, query_lens=[512], context=512)),
        ("FP8 E5M2 decode B=64", 90, attention_case(**dict(bf16, kv_dtype=torch.float8_e5m2), query_lens=[1] * 64,
                                                    context=1023)),
        ("A100 fp16 G=3 Dh=24 decode", 80, attention_case(torch.float16, 6, 2, 24, 32, [1, 1, 1], 100, False)),
        ("A100 fp32 G=1 Dh=64 prefill", 80, attention_case(torch.float32, 2, 2, 64, 16, [100, 7], 30, False)),
    ]


def nvidia_tool(name: str) -> str:
    """Path of a tool triton bundles for its NVIDIA backend (ptxas, cuobjdump)."""
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def missing_tools() -> str | None:
    """Why this machine cannot compile for an NVIDIA GPU without one, or None when it can."""
    missing = [name for name in ("ptxas", "cuobjdump") if not os.access(nvidia_tool(name), os.X_OK)]
    if missing:
        return f"triton {triton.__version__} bundles no {' or '.join(missing)} here ({nvidia_tool('')})"
    return None


def resources(cubin: bytes) -> dict[str, int]:
    cuobjdump = nvidia_tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    return dict(registers=int(m[1]), stack=int(m[2]), spill_bytes=int(m[4]))


def h100_occupancy(registers: int, warps: int, shared: int) -> tuple[float, str]:
    """(resident warps / 64, the limiting resource) on an H100 SM: 65,536 registers allocated per warp
    in units of 256, 64 warps, 32 blocks, 228 KB shared memory with 1 KB reserved per block."""
    per_warp = -(-registers * 32 // 256) * 256
    limits = dict(registers=65536 // (per_warp * warps) if registers else 32, shared=(228 * 1024) // (shared + 1024),
                  warps=64 // warps, blocks=32)
    limiter = min(limits, key=limits.get)
    return limits[limiter] * warps / 64, limiter


def rows(dump: str | None = None) -> list[dict]:
    from kvmesh.replica.attention import triton_paged_attention as tpa

    stand_in = StandInDriver()
    driver.set_active(stand_in)
    tpa.num_sms = lambda device: H100_SMS  # split-KV sized for an H100 (the tensors are on the CPU)
    compile_instead_of_running()
    out = []
    for label, capability, run in cases():
        stand_in.capability = capability
        first = len(COMPILED)
        run()
        for name, grid, kernel in COMPILED[first:]:
            md = kernel.metadata
            used = resources(kernel.asm["cubin"])
            occupancy, limiter = h100_occupancy(used["registers"], md.num_warps, md.shared)
            out.append(dict(case=label, kernel=name, target=f"sm_{capability}", grid=list(grid), warps=md.num_warps,
                            stages=md.num_stages, **used, shared=md.shared,
                            occupancy=round(occupancy, 3), limiter=limiter,
                            mma=sorted(set(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)",
                                                      kernel.asm["ptx"]))),
                            fp8_cvt=sorted(set(re.findall(r"\bcvt[\w.]*e[45]m[23]x2[\w.]*", kernel.asm["ptx"])))))
            if dump:
                os.makedirs(dump, exist_ok=True)
                tag = re.sub(r"\W+", "_", f"{label}_{name}")
                for ext in ("ttgir", "ptx", "cubin"):
                    with open(os.path.join(dump, f"{tag}.{ext}"), "wb" if ext == "cubin" else "w") as f:
                        f.write(kernel.asm[ext])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", help="also write each kernel's TTGIR, PTX and cubin here")
    parser.add_argument("--out", help="also write the rows as one JSON document (results/triton_aot.json: BENCHMARKS' "
                                      "FP8 table)")
    if (problem := missing_tools()) is not None:
        print(problem, file=sys.stderr)
        return 2
    args = parser.parse_args()
    report = rows(args.dump)
    for row in report:
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"triton": triton.__version__, "rows": report}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
