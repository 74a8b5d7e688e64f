"""Every Triton kernel compiled for an H100 (sm_90) on this CPU machine, read like a profiler would.

``triton_aot.py`` (run in its own process: the interpreter this one runs under replaces triton.jit)
compiles each kernel through the project's wrappers at the 1.1B TinyLlama shape and reports what
the cubin and PTX say. These tests hold the kernels to what an H100 needs: bf16 tensor-core dots
with fp32 accumulation (no TF32), no spills, at least a quarter of the SM's warps resident, and
split-KV filling the 132 SMs where a step's own programs would not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .triton_aot import missing_tools

pytestmark = [pytest.mark.skipif(missing_tools() is not None,
                                 reason=f"cannot compile for sm_90 here: {missing_tools()}"),
              pytest.mark.slow]  # compiles the kernels in child processes

SCRIPT = Path(__file__).with_name("triton_aot.py")
DECODE = ("decode B=1", "decode B=64", "decode B=256")
LORA = ("LoRA decode B=64", "LoRA prefill 512-token chunk")
FP8_DECODE = ("FP8 decode B=1", "FP8 decode B=64", "FP8 E5M2 decode B=64")
FP8 = (*FP8_DECODE, "FP8 prefill 512-token chunk")
H100_CASES = (*DECODE, "prefill 512-token chunk", "16-token suffix over 2k cached", "layers T=1", "layers T=256",
              "layers T=512", *LORA, *FP8)


@pytest.fixture(scope="module")
def report() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def rows(report: list[dict], kernel: str | None = None, target: str = "sm_90") -> list[dict]:
    return [r for r in report if r["target"] == target and kernel in (None, r["kernel"])]


def test_every_case_compiles_every_kernel_it_launches(report):
    assert {r["case"] for r in rows(report)} == set(H100_CASES)
    assert {r["kernel"] for r in report} == {"_unified_attention_kernel", "_rotary_and_cache_kernel",
                                             "_reshape_and_cache_kernel", "_rms_norm_kernel", "_rotary_kernel",
                                             "_silu_and_mul_kernel", "_lora_segment_gemm"}


def test_a_decode_step_is_one_attention_launch_per_layer_split_or_not(report):
    """Rotary, the K/V cache write and the split-KV merge happen inside the attention kernel in decode steps;
    prefill chunks write their K/V (with rotary) first, and merge their splits inside attention too."""
    launched = {}
    for r in rows(report):
        launched.setdefault(r["case"], []).append(r["kernel"])
    for case in (*DECODE, *FP8_DECODE):
        assert launched[case] == ["_unified_attention_kernel"], case
    for case in ("prefill 512-token chunk", "16-token suffix over 2k cached", "FP8 prefill 512-token chunk"):
        assert launched[case] == ["_rotary_and_cache_kernel", "_unified_attention_kernel"], case


def test_attention_dots_are_bf16_tensor_core_mmas_with_fp32_accumulators(report):
    attention = rows(report, "_unified_attention_kernel")
    assert len(attention) == 5 + len(FP8)  # an FP8 cache's blocks are dequantized to bf16 before the dots
    for row in attention:
        assert row["mma"], row  # tensor cores, not FMA loops
        assert all(".bf16.bf16" in mma and ".f32" in mma for mma in row["mma"]), row
    for case in ("prefill 512-token chunk", "FP8 prefill 512-token chunk"):
        prefill = next(r for r in attention if r["case"] == case)
        assert all(mma.startswith("wgmma") for mma in prefill["mma"]), prefill  # Hopper's warpgroup MMA
    fp16 = rows(report, "_unified_attention_kernel", target="sm_80")[0]
    assert all(".f16.f16" in mma for mma in fp16["mma"]), fp16


def test_both_lora_passes_are_bf16_tensor_core_mmas(report):
    """The shrink (x @ A.T into an fp32 buffer) and the expand (the buffer read in bf16 @ B.T, added to y)."""
    lora = rows(report, "_lora_segment_gemm")
    assert [r["case"] for r in lora] == [LORA[0], LORA[0], LORA[1], LORA[1]]  # shrink, expand per case
    for row in lora:
        assert row["mma"] and all(".bf16.bf16" in mma and ".f32" in mma for mma in row["mma"]), row


def test_nothing_runs_in_tf32(report):
    assert not [r for r in report if any("tf32" in mma for mma in r["mma"])]


def test_no_kernel_spills_registers_at_the_served_shapes(report):
    assert [(r["case"], r["kernel"], r["spill_bytes"], r["stack"]) for r in rows(report)
            if r["spill_bytes"] or r["stack"]] == []


def test_every_kernel_keeps_a_quarter_of_the_sm_busy(report):
    low = [(r["case"], r["kernel"], r["occupancy"]) for r in rows(report) if r["occupancy"] < 0.25]
    assert low == []
    decode = [r for r in rows(report, "_unified_attention_kernel") if r["case"] in DECODE]
    assert len(decode) == 3 and min(r["occupancy"] for r in decode) >= 0.25


def test_split_kv_fills_the_h100_where_the_step_alone_would_not(report):
    attention = {r["case"]: r for r in rows(report, "_unified_attention_kernel")}
    # batch 1: 4 KV heads x 32 parts = 128 programs on 132 SMs; 64 rows fill the GPU unsplit
    assert attention["decode B=1"]["grid"][1:] == [4, 32]
    assert attention["decode B=64"]["grid"][2] == 1 and attention["decode B=256"]["grid"][2] == 1
    # a 16-token suffix over 2k: 2 query blocks x 4 KV heads, split 16 ways (128 keys or more per part)
    assert attention["16-token suffix over 2k cached"]["grid"][2] == 16
    assert attention["prefill 512-token chunk"]["grid"][2] == 1
    assert {case for case, r in attention.items() if r["grid"][2] > 1} == {"decode B=1",
                                                                           "16-token suffix over 2k cached",
                                                                          "FP8 decode B=1"}


def test_fp8_kernels_load_fp8_pairs_and_store_them_saturated(report):
    """An FP8 cache's loads unpack two values per ``cvt`` (to f16x2, then scaled), and its writes (the cache write
    of a prefill chunk, the decode step's new token inside attention) round to nearest and saturate; a model-dtype
    cache has none of these."""
    for row in rows(report):
        e5m2 = "E5M2" in row["case"]
        if row["case"] not in FP8:
            assert row["fp8_cvt"] == [], row
        elif row["kernel"] == "_unified_attention_kernel":
            assert f"cvt.rn.f16x2.{'e5m2' if e5m2 else 'e4m3'}x2" in row["fp8_cvt"], row
        if row["case"] in FP8_DECODE or row["kernel"] == "_rotary_and_cache_kernel" and row["case"] in FP8:
            assert f"cvt.rn.satfinite.{'e5m2' if e5m2 else 'e4m3'}x2.f32" in row["fp8_cvt"], row
