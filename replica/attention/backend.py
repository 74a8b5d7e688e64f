"""The interface every attention backend implements, and the registry that picks one."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

import torch
from kvmesh.replica.attention.flash_attn_backend import PAGED_BLOCK_MULTIPLE
from kvmesh.replica.attention.kv_quant import is_fp8
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.triton_utils import triton_problem

if TYPE_CHECKING:  # the backends' modules import CUDA-only code: named for type checkers only
    from kvmesh.replica.attention.flash_attn_backend import FlashAttentionMetadata
    from kvmesh.replica.attention.torch_backend import TorchAttentionMetadata
    from kvmesh.replica.attention.triton_backend import TritonAttentionMetadata

    AttentionMetadata = TorchAttentionMetadata | FlashAttentionMetadata | TritonAttentionMetadata
    """What a backend's ``build`` derives once per step and every layer's ``forward`` reads."""


# name -> "module:Class", imported lazily so CUDA-only code is never imported on CPU.
_BACKENDS = {
    "torch": "kvmesh.replica.attention.torch_backend:TorchAttentionBackend",
    "flash_attn": "kvmesh.replica.attention.flash_attn_backend:FlashAttentionBackend",
    "triton": "kvmesh.replica.attention.triton_backend:TritonAttentionBackend",
}


class AttentionBackend(Protocol):
    name: str
    fuses_rotary: bool
    """``forward`` also takes ``rotary`` (positions [T], cos_sin_cache) and rotates q and k in its cache-write
    launch (the Triton backend); False: the model rotates them first."""

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """Shape of one layer's cache (K and V) in this backend's layout."""

    @staticmethod
    def supports_static_decode(block_size: int) -> bool:
        """Whether decode steps have fixed shapes per batch size at this block size (CUDA graphs can capture
        them, replica/worker/graphs/cuda_graph.py; such a backend also offers ``static_decode_metadata``)."""

    @staticmethod
    def supports_static_prefill(block_size: int) -> bool:
        """Whether one-request prefill steps have fixed shapes at this block size
        (replica/worker/graphs/prefill_graph.py)."""

    def build(self, common: CommonAttentionMetadata) -> AttentionMetadata:
        """Per-step metadata derived once and shared by all layers."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """Write k/v [T, Hk, D] into ``kv_cache`` (one layer, ``kv_cache_shape``) at the step's slots,
        then attend q [T, Hq, D] over each request's context; returns [T, Hq, D]. With ``kv_cache``
        None (profiling), every request must be a fresh prefill."""


def available_backends() -> list[str]:
    return list(_BACKENDS)


def _flash_attn_module():
    """The installed ``flash_attn`` module, or None."""
    try:
        return importlib.import_module("flash_attn")
    except ImportError:
        return None


def flash_attn_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the flash_attn backend cannot run on ``device`` with ``dtype``, or None when it can.

    The real flash-attn runs CUDA and fp16/bf16 only; a stand-in module (such as the plain-torch
    reference in ``flash_attn_reference``) may declare ``SUPPORTED_DEVICES``/``SUPPORTED_DTYPES``."""
    module = _flash_attn_module()
    if module is None:
        return "the flash-attn package is not installed (the gpu extra: pip install '.[gpu]' in kvmesh's source tree)"
    devices = getattr(module, "SUPPORTED_DEVICES", ("cuda",))
    if device.type not in devices:
        return f"flash-attn runs on {'/'.join(devices)} devices, not {device.type}"
    dtypes = getattr(module, "SUPPORTED_DTYPES", (torch.float16, torch.bfloat16))
    if dtype not in dtypes:
        names = "/".join(str(t).removeprefix("torch.") for t in dtypes)
        return f"flash-attn computes in {names}, not {str(dtype).removeprefix('torch.')} (set dtype='bfloat16')"
    return None


def default_backend(device: torch.device, dtype: torch.dtype, block_size: int | None, fp8_cache: bool = False) -> str:
    """What ``attention_backend=None`` picks: on CUDA flash_attn where its paged path runs (block_size a
    multiple of 256, flash-attn installed, no FP8 cache), else triton (any block size, CUDA graphs); torch
    elsewhere."""
    if device.type != "cuda":
        return "torch"
    paged = block_size is not None and block_size % PAGED_BLOCK_MULTIPLE == 0 and not fp8_cache
    if paged and flash_attn_problem(device, dtype) is None:
        return "flash_attn"
    if triton_problem(device) is None:
        return "triton"
    return "flash_attn" if not fp8_cache and flash_attn_problem(device, dtype) is None else "torch"


def get_attn_backend(name: str | None, device: torch.device, dtype: torch.dtype,
                     block_size: int | None = None, kv_cache_dtype: torch.dtype | None = None) -> AttentionBackend:
    """The backend ``name``, or for None the best one for the device, block size and KV cache element type
    (``default_backend``; ``kv_cache_dtype`` None: the model's ``dtype``)."""
    fp8_cache = kv_cache_dtype is not None and is_fp8(kv_cache_dtype)
    if name is None:
        name = default_backend(device, dtype, block_size, fp8_cache)
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {available_backends()}")
    if name == "flash_attn" and fp8_cache:
        raise ValueError(f"attention_backend='flash_attn' cannot read an FP8 KV cache "
                         f"(kv_cache_dtype {str(kv_cache_dtype).removeprefix('torch.')}): flash-attn's paged path "
                         "takes fp16/bf16 blocks only; use attention_backend='triton' (CUDA) or 'torch', or "
                         "kv_cache_dtype='auto'")
    if name == "flash_attn" and (problem := flash_attn_problem(device, dtype)) is not None:
        raise ValueError(f"attention_backend='flash_attn' cannot run here: {problem}; "
                         "or use attention_backend='torch'")
    if name == "triton" and (problem := triton_problem(device)) is not None:
        raise ValueError(f"attention_backend='triton' cannot run here: {problem}; or use attention_backend='torch'")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()
