"""The FP8 KV cache's per-layer scales (vLLM's ``k_scale``/``v_scale``): read from the checkpoint, else 1.0.

A checkpoint quantized for an FP8 KV cache carries one scale per attention layer for its keys and one for its
values, under one of the names vLLM reads:

    model.layers.N.self_attn.k_scale / v_scale                  (compressed-tensors, llm-compressor)
    model.layers.N.self_attn.kv_scale                           (AutoFP8: one scale for both)
    model.layers.N.self_attn.k_proj.output_scale / v_proj...    (ModelOpt)

``load_weights`` leaves these tensors to this file (they are no parameter of the model). A checkpoint
without them gets 1.0 for every layer, and the log says so, as vLLM's warning does: the values are
then stored as they are, clamped to the format's range.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import struct

import torch
from kvmesh.replica.attention.kv_quant import default_scales, is_fp8

logger = logging.getLogger(__name__)

KV_SCALE_NAME = re.compile(r"model\.layers\.(\d+)\.self_attn\.(?:(k|v|kv)_scale|(k|v)_proj\.output_scale)$")
"""A checkpoint tensor that is a KV cache scale: group 1 the layer, group 2 or 3 which ("k", "v" or "kv")."""


def checkpoint_kv_scales(model_dir: str, num_layers: int) -> dict[int, dict[str, float]]:
    """{layer: {"k": scale, "v": scale}} of every KV scale in ``model_dir``'s safetensors (empty: none)."""
    from safetensors import safe_open

    found: dict[int, dict[str, float]] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                m = KV_SCALE_NAME.fullmatch(name)
                if m is None or int(m.group(1)) >= num_layers:
                    continue
                which = m.group(2) or m.group(3)
                value = float(f.get_tensor(name).float().max())  # per tensor: a per-head scale's largest
                for side in ("k", "v") if which == "kv" else (which,):
                    found.setdefault(int(m.group(1)), {})[side] = value
    return found


def attach_kv_scales(layers: list, kv_cache_dtype: torch.dtype, model_dir: str | None, device: torch.device) -> None:
    """Give every attention layer its ``kv_scales`` (k_scale, v_scale): None for a cache in the model's dtype,
    else the checkpoint's (``model_dir`` None: dummy weights, no checkpoint) or 1.0, logged."""
    if not is_fp8(kv_cache_dtype):
        for attn in layers:
            attn.kv_scales = None
        return
    scales = default_scales(len(layers), device)
    found = checkpoint_kv_scales(model_dir, len(layers)) if model_dir and os.path.isdir(model_dir) else {}
    for i, per_layer in found.items():
        for side, value in per_layer.items():
            if not value > 0.0:
                raise ValueError(f"layer {i}'s {side}_scale in the checkpoint is {value}; a KV scale must be > 0")
            scales[i][0 if side == "k" else 1].fill_(value)
    name = str(kv_cache_dtype).removeprefix("torch.")
    if len(found) < len(layers):
        logger.warning("KV cache in %s: the checkpoint has k/v scales for %d of %d layers; the others use "
                       "1.0 (values stored as they are, clamped to +-%g). If this is unintended, give a checkpoint "
                       "with k_scale/v_scale tensors", name, len(found), len(layers), torch.finfo(kv_cache_dtype).max)
    else:
        logger.info("KV cache in %s with the checkpoint's per-layer k/v scales", name)
    for attn, pair in zip(layers, scales, strict=True):
        attn.kv_scales = pair


def kv_scales_digest(layers: list) -> str:
    """The attention layers' k/v scales digested (16 hex digits of a SHA-256 over their float32 values, layer
    order): what two replicas' FP8 caches must share for a block's bytes to mean the same values on both; empty
    for a cache in the model's dtype (no scales). Read once, when the cache is laid out (a host copy per scale)."""
    pairs = [attn.kv_scales for attn in layers if attn.kv_scales is not None]
    if not pairs:
        return ""
    values = torch.stack([s.detach().float().reshape(()) for pair in pairs for s in pair]).tolist()
    return hashlib.sha256(struct.pack(f"<{len(values)}f", *values)).hexdigest()[:16]
