"""The FP8 KV cache (vLLM's ``--kv-cache-dtype fp8``): which element type a cache holds and how values enter it.

A cache of ``kv_cache_dtype`` "fp8"/"fp8_e4m3" holds ``torch.float8_e4m3fn`` (max 448, 3 mantissa bits),
"fp8_e5m2" ``torch.float8_e5m2`` (max 57344, 2 mantissa bits); "auto" holds the model's dtype. Every
attention layer has one scale for its keys and one for its values (per tensor, vLLM's ``k_scale`` /
``v_scale``), float32 tensors of one element on the device, so kernels read them without a host sync:

    write   cache = clamp(x / scale, -max, max).to(fp8)
    read    x'    = cache.float() * scale                 (then the model's dtype)

The scales come from the checkpoint when it has them (replica/worker/kv_scales.py), else 1.0 (logged).
"""

from __future__ import annotations

import torch

FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
"""``kv_cache_dtype`` -> the cache's element type (vLLM's spellings; "fp8" is E4M3 as on CUDA in vLLM)."""


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The element type of a cache of ``kv_cache_dtype`` ("auto": ``model_dtype``)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in FP8_DTYPES:
        raise ValueError(f"kv_cache_dtype must be 'auto' or one of {sorted(FP8_DTYPES)}, got {kv_cache_dtype!r}")
    return FP8_DTYPES[kv_cache_dtype]


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether a cache of ``dtype`` is quantized (written through scales)."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` / ``scale`` (a one-element float32 tensor) clamped to ``dtype``'s range, in ``dtype``."""
    limit = torch.finfo(dtype).max
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An FP8 ``x`` times ``scale`` (one-element float32), in ``dtype`` (the model's)."""
    return (x.float() * scale).to(dtype)


def default_scales(num_layers: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(k_scale, v_scale) = (1.0, 1.0) for every layer, one-element float32 tensors on ``device``."""
    return [(torch.ones(1, dtype=torch.float32, device=device), torch.ones(1, dtype=torch.float32, device=device))
            for _ in range(num_layers)]


def kernel_scales(kv_scales: tuple[torch.Tensor, torch.Tensor] | None, kv_cache: torch.Tensor,
                  unused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool, float]:
    """What a Triton kernel takes for a cache ``kv_cache`` written through ``kv_scales``: (k_scale, v_scale,
    KV_QUANT, FP8_MAX); without scales the kernel reads no scale (``unused`` stands in) and stores as it loads."""
    if kv_scales is None or not is_fp8(kv_cache.dtype):
        return unused, unused, False, 0.0
    return kv_scales[0], kv_scales[1], True, float(torch.finfo(kv_cache.dtype).max)
