"""One LoRA adapter's weights, read from PEFT's safetensors onto kvmesh's layers and kept in host memory.

PEFT names a projection's factors after the Hugging Face module::

    base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight   [out, r]

kvmesh fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``: each sub-projection's factors become one
slice of the fused layer (``LoRATarget.shard_id``, the base layer's own weight-loader shard). The scale is folded
into B here, once, so a step computes ``(x @ A.T) @ B.T``. A factor with a NaN or an infinity is refused by name.

The adapter's identity (``LoadedLoRA.identity``) is a SHA-256 over its tensors as the file holds them (sorted by
name: name, dtype, shape, bytes) and its scale: it keys the adapter's blocks, so the same files agree on every
replica and other weights under the same name never meet the old KV.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
from kvmesh.replica.lora.peft_config import WEIGHTS_FILE, LoRAError, read_peft_config
from kvmesh.replica.serving.lora_request import LoRARequest

PEFT_PREFIX = "base_model.model."
ShardId = int | str | None


@dataclass(frozen=True, slots=True)
class LoRATarget:
    """Where a PEFT module's factors go: a kvmesh layer (its module path) and its slice of that layer."""

    layer: str
    """kvmesh module path of the adapted layer, e.g. ``model.layers.3.self_attn.qkv_proj``."""
    shard_id: ShardId
    """The slice: ``"q"``/``"k"``/``"v"``, gate/up's index, None for an unfused layer."""
    in_features: int
    """The projection's whole input width (A is [r, in_features])."""
    out_features: int
    """The projection's whole output width (B is [out_features, r])."""


@dataclass(slots=True)
class LoRAAdapter:
    """An adapter in host memory: per kvmesh layer, per slice, (A [r, in], scale * B [out, r])."""

    lora: LoRARequest
    rank: int
    weights: dict[str, dict[ShardId, tuple[torch.Tensor, torch.Tensor]]]
    nbytes: int
    """Bytes of its factors (what a load into a device slot moves, summed over ranks under TP)."""
    identity: str
    """A digest of its tensors and scale (module doc): what keys its blocks after its name."""


def load_adapter(lora: LoRARequest, targets: dict[str, LoRATarget], max_lora_rank: int,
                 dtype: torch.dtype, pin: bool = False) -> LoRAAdapter:
    """Read and check ``lora.lora_path``; ``targets`` maps PEFT module paths (``model.layers.0.self_attn.q_proj``)
    to kvmesh's layers. Raises ``LoRAError`` for anything kvmesh cannot serve exactly."""
    from safetensors.torch import load_file

    config = read_peft_config(lora.lora_path, max_lora_rank)
    try:
        tensors = load_file(os.path.join(lora.lora_path, WEIGHTS_FILE))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own errors for a bad file
        raise LoRAError(f"LoRA adapter {lora.lora_path!r}: {WEIGHTS_FILE} is not readable: {e}") from None
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        module, kind = _split_name(lora, name)
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise LoRAError(f"LoRA adapter {lora.lora_path!r}: tensor {name!r} holds NaN or infinite values")
        factors.setdefault(module, {})[kind] = tensor
    if not factors:
        raise LoRAError(f"LoRA adapter {lora.lora_path!r} holds no LoRA factors")
    weights: dict[str, dict[ShardId, tuple[torch.Tensor, torch.Tensor]]] = {}
    nbytes = 0
    for module, pair in sorted(factors.items()):
        target = targets.get(module)
        if target is None:
            raise LoRAError(f"LoRA adapter {lora.lora_path!r} adapts {module!r}, which this model has no "
                            "adaptable projection for (kvmesh adapts q/k/v/o/gate/up/down_proj)")
        if set(pair) != {"lora_A", "lora_B"}:
            raise LoRAError(f"LoRA adapter {lora.lora_path!r}: {module!r} needs both lora_A and lora_B, "
                            f"has {sorted(pair)}")
        a, b = pair["lora_A"], pair["lora_B"]
        want_a, want_b = (config.r, target.in_features), (target.out_features, config.r)
        if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
            raise LoRAError(f"LoRA adapter {lora.lora_path!r}: {module!r} has lora_A {tuple(a.shape)} and lora_B "
                            f"{tuple(b.shape)}; this model and r={config.r} need {want_a} and {want_b}")
        a = a.to(dtype).contiguous()
        b = (b.float() * config.scale).to(dtype).contiguous()
        if pin:
            a, b = a.pin_memory(), b.pin_memory()
        weights.setdefault(target.layer, {})[target.shard_id] = (a, b)
        nbytes += a.numel() * a.element_size() + b.numel() * b.element_size()
    return LoRAAdapter(lora, config.r, weights, nbytes, adapter_identity(tensors, config.scale))


def adapter_identity(tensors: dict[str, torch.Tensor], scale: float) -> str:
    """SHA-256 (hex, 32 digits) of the tensors as read (by name: name, dtype, shape, bytes) and the scale."""
    digest = hashlib.sha256(b"kvmesh/lora-identity/v1\x00" + repr(float(scale)).encode())
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"\x00{name}\x00{tensor.dtype}\x00{tuple(tensor.shape)}\x00".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:32]


def _split_name(lora: LoRARequest, name: str) -> tuple[str, str]:
    """``base_model.model.X.lora_A.weight`` -> ("X", "lora_A"); anything else is refused."""
    body = name.removeprefix(PEFT_PREFIX)
    for kind in ("lora_A", "lora_B"):
        suffix = f".{kind}.weight"
        if body.endswith(suffix):
            return body[: -len(suffix)], kind
    raise LoRAError(f"LoRA adapter {lora.lora_path!r} holds {name!r}; kvmesh serves lora_A/lora_B weights only "
                    "(no biases, DoRA magnitudes or embedding factors)")
