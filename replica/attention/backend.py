"""The interface every attention backend implements, and the registry that picks one."""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata

# name -> "module:Class", imported lazily so CUDA-only code is never imported on CPU.
_BACKENDS = {
    "torch": "kvmesh.replica.attention.torch_backend:TorchAttentionBackend",
    "flash_attn": "kvmesh.replica.attention.flash_attn_backend:FlashAttentionBackend",
}


class AttentionBackend(Protocol):
    name: str

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """Shape of one layer's cache (K and V) in this backend's layout."""

    def build(self, common: CommonAttentionMetadata) -> Any:
        """Per-step metadata derived once and shared by all layers."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                metadata: Any, scale: float) -> torch.Tensor:
        """Write k/v [T, Hk, D] into ``kv_cache`` (one layer, ``kv_cache_shape``) at the step's slots,
        then attend q [T, Hq, D] over each request's context; returns [T, Hq, D]. With ``kv_cache``
        None (profiling), every request must be a fresh prefill."""


def available_backends() -> list[str]:
    return list(_BACKENDS)


def _flash_attn_usable(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        importlib.import_module("flash_attn")
    except ImportError:
        return False
    return True


def get_attn_backend(name: str | None, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """The backend ``name``, or for None the best one for the device (flash_attn on CUDA when installed)."""
    if name is None:
        name = "flash_attn" if _flash_attn_usable(device) and dtype != torch.float32 else "torch"
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {available_backends()}")
    if name == "flash_attn" and not _flash_attn_usable(device):
        raise ValueError("attention_backend='flash_attn' needs a CUDA device and the flash-attn package; "
                         "install flash-attn or use attention_backend='torch'")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()
