"""The FP8 KV cache in the attention backends: values written as x / scale in FP8, read back as x * scale.

Each backend's FP8 step is held to the plain-torch reference run on what the cache can hold: the step's k/v
and the cache's old contents quantized and dequantized with the layer's scales. The cache's bytes after the
step are the quantized k/v at their slots, the old blocks untouched. The Triton kernels run through Triton's
interpreter on CPU (tests/conftest.py), the compiled kernels with CUDA.
"""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.attention.kv_quant import dequantize, kv_cache_torch_dtype, quantize
from kvmesh.replica.triton_utils import triton_problem

from . import attention_steps
from .test_triton_attention import reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
SPECS = [(37, 1), (0, 1), (15, 1), (0, 9), (20, 6), (16, 17)]  # decodes, a fresh prefill, chunks over a prefix
needs_triton = pytest.mark.skipif(triton_problem(DEVICE) is not None, reason=str(triton_problem(DEVICE)))


def scales() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([0.5], device=DEVICE), torch.tensor([0.25], device=DEVICE)


def fp8_step(dtype: torch.dtype, specs=SPECS, block_size=16, hq=4, hk=2, dh=8, seed=0):
    """(q, k, v, FP8 logical cache [2, blocks, bs, Hk, Dh], common, what the reference reads)."""
    q, k, v, cache, common = attention_steps.make_step(specs, block_size, seed=seed, hq=hq, hk=hk, dh=dh,
                                                       device=DEVICE)
    k, v, cache = k * 4, v * 4, cache * 4  # beyond E4M3's finest steps; the reference sees the rounding
    ks, vs = scales()
    cache8 = torch.stack([quantize(cache[0], ks, dtype), quantize(cache[1], vs, dtype)])
    seen = (dequantize(quantize(k, ks, dtype), ks, torch.float32),
            dequantize(quantize(v, vs, dtype), vs, torch.float32),
            torch.stack([dequantize(cache8[0], ks, torch.float32), dequantize(cache8[1], vs, torch.float32)]))
    return q, k, v, cache8, common, seen


def expected_cache(k, v, cache8, common):
    ks, vs = scales()
    flat = cache8.clone().view(2, -1, *cache8.shape[3:])
    flat[0, common.slot_mapping] = quantize(k, ks, cache8.dtype)
    flat[1, common.slot_mapping] = quantize(v, vs, cache8.dtype)
    return flat.view(cache8.shape)


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The logical [2, blocks, bs, Hk, Dh] cache in the torch backend's [2, Hk, blocks, bs, Dh]."""
    return cache.permute(0, 3, 1, 2, 4).contiguous()


@pytest.mark.parametrize("dtype", FP8)
def test_torch_backend_writes_fp8_and_attends_the_dequantized_cache(dtype):
    q, k, v, cache8, common, (k_seen, v_seen, cache_seen) = fp8_step(dtype)
    expected, _ = reference(q, k_seen, v_seen, cache_seen, common, 0.3)
    backend = get_attn_backend("torch", DEVICE, torch.float32, kv_cache_dtype=dtype)
    layout = head_major(cache8)
    got = backend.forward(q, k, v, layout, backend.build(common), 0.3, kv_scales=scales())
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert layout.dtype == dtype
    assert torch.equal(layout.view(torch.uint8), head_major(expected_cache(k, v, cache8, common)).view(torch.uint8))


@needs_triton
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("specs", [SPECS, [(37, 1), (3, 1), (70, 1)]], ids=["mixed", "decode-only"])
def test_triton_backend_writes_fp8_and_attends_the_dequantized_cache(dtype, specs):
    q, k, v, cache8, common, (k_seen, v_seen, cache_seen) = fp8_step(dtype, specs)
    expected, _ = reference(q, k_seen, v_seen, cache_seen, common, 0.3)
    backend = get_attn_backend("triton", DEVICE, torch.float32, kv_cache_dtype=dtype)
    layout = cache8.clone()
    got = backend.forward(q, k, v, layout, backend.build(common), 0.3, kv_scales=scales())
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(layout.view(torch.uint8), expected_cache(k, v, cache8, common).view(torch.uint8))


@needs_triton
@pytest.mark.parametrize("specs", [[(37, 1), (3, 1)], [(37, 1), (3, 7)]], ids=["decode-only", "mixed"])
def test_triton_rotary_folds_quantize_what_the_model_dtype_cache_holds(specs):
    """Rotary in the cache write (prefill chunks) or in the attention launch (decode-only steps): the FP8 cache
    holds the quantized rotated keys the model-dtype cache holds, and the output stays within FP8's rounding."""
    from kvmesh.replica.layers.rotary import RotaryEmbedding

    q, k, v, cache, common = attention_steps.make_step(specs, 16, hq=4, hk=2, dh=8, device=DEVICE)
    positions = torch.cat([torch.arange(s - n, s) for s, (_, n) in zip(common.seq_lens_cpu, specs, strict=True)])
    with torch.device("cpu"):
        rotary = RotaryEmbedding(8, 64, 10000.0).to(DEVICE)
    rope = (positions.to(DEVICE), rotary.cos_sin_cache)
    ks, vs = scales()
    cache8 = torch.stack([quantize(cache[0], ks, torch.float8_e4m3fn), quantize(cache[1], vs, torch.float8_e4m3fn)])
    cache_plain = torch.stack([dequantize(cache8[0], ks, torch.float32), dequantize(cache8[1], vs, torch.float32)])
    plain = get_attn_backend("triton", DEVICE, torch.float32)
    expected = plain.forward(q.clone(), k, v, cache_plain, plain.build(common), 0.3, rope)
    fp8 = get_attn_backend("triton", DEVICE, torch.float32, kv_cache_dtype=torch.float8_e4m3fn)
    got = fp8.forward(q.clone(), k, v, cache8, fp8.build(common), 0.3, rope, kv_scales=scales())
    flat_plain, flat8 = cache_plain.view(2, -1, 2, 8), cache8.view(2, -1, 2, 8)
    slots = common.slot_mapping
    assert torch.equal(flat8[0, slots].view(torch.uint8),
                       quantize(flat_plain[0, slots], ks, flat8.dtype).view(torch.uint8))
    assert torch.equal(flat8[1, slots].view(torch.uint8),
                       quantize(flat_plain[1, slots], vs, flat8.dtype).view(torch.uint8))
    torch.testing.assert_close(got, expected, atol=0.15, rtol=0.1)


def test_quantize_clamps_to_the_format_and_kv_cache_dtypes_are_vllms():
    one = torch.ones(1)
    assert quantize(torch.tensor([1e6, -1e6]), one, torch.float8_e4m3fn).float().tolist() == [448.0, -448.0]
    assert quantize(torch.tensor([1e6]), one, torch.float8_e5m2).float().item() == 57344.0
    assert dequantize(quantize(torch.tensor([3.0]), torch.tensor([0.5]), torch.float8_e4m3fn), torch.tensor([0.5]),
                      torch.float32).item() == 3.0
    assert kv_cache_torch_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_cache_torch_dtype("fp8", torch.bfloat16) == torch.float8_e4m3fn
    assert kv_cache_torch_dtype("fp8_e5m2", torch.float16) == torch.float8_e5m2


def test_flash_attn_refuses_an_fp8_cache_by_name_and_the_default_backend_avoids_it():
    with pytest.raises(ValueError, match=r"flash_attn' cannot read an FP8 KV cache \(kv_cache_dtype float8_e4m3fn\)"):
        get_attn_backend("flash_attn", torch.device("cpu"), torch.bfloat16, 256, torch.float8_e4m3fn)
    assert get_attn_backend(None, torch.device("cpu"), torch.float32, 16, torch.float8_e4m3fn).name == "torch"
