"""Weights: stream a Hugging Face safetensors directory tensor by tensor into a (sharded) model,
or make dummy random weights from the model's shapes.

Each checkpoint tensor goes to its parameter's ``weight_loader``; fused parameters are found via
the model's ``packed_modules_mapping`` (``q_proj`` -> (``qkv_proj``, "q")). Tensors arrive as
safetensors slices, so a tensor-parallel rank reads only its own rows/columns from disk.
Dummy weights are generated as *whole* checkpoint tensors from a seed and go through the same
loaders, so every TP layout of a dummy model holds the same numbers.
"""

from __future__ import annotations

import glob
import logging
import os
import time
import zlib
from collections.abc import Iterable, Iterator

import torch
from kvmesh.replica.distributed.parallel_state import SINGLE, ParallelState
from kvmesh.replica.layers.linear import LoadedWeight, default_weight_loader
from kvmesh.replica.model_config import ModelSpec
from kvmesh.replica.models import get_model_class
from kvmesh.replica.worker.kv_scales import KV_SCALE_NAME
from torch import nn

logger = logging.getLogger(__name__)


def safetensors_weights(model_dir: str) -> Iterator[tuple[str, LoadedWeight]]:
    """(name, safetensors slice) for every tensor of every ``*.safetensors`` file, streaming."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors files in {model_dir}; convert the checkpoint to safetensors or use load_format='dummy'"
        )
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_slice(name)


def load_weights(model: nn.Module, weights: Iterable[tuple[str, LoadedWeight]]) -> int:
    """Feed checkpoint tensors to the model's parameter loaders; returns how many were loaded.

    Raises if a parameter received nothing (a truncated or mismatched checkpoint). KV cache scales are read
    by kv_scales.py, not here.
    """
    packed = model.packed_modules_mapping
    tied = model.spec.tie_word_embeddings
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    count = 0
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight") or KV_SCALE_NAME.fullmatch(name):
            continue
        for ckpt_name, (target, shard_id) in packed.items():
            if f".{ckpt_name}." in name:
                pname = name.replace(f".{ckpt_name}.", f".{target}.")
                param = params[pname]
                param.weight_loader(param, tensor, shard_id)
                loaded.add(pname)
                break
        else:
            if name not in params:
                raise KeyError(f"checkpoint tensor {name!r} has no matching parameter in {type(model).__name__}")
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        count += 1
    missing = sorted(set(params) - loaded - ({"lm_head.weight"} if tied else set()))
    if missing:
        raise ValueError(f"checkpoint has no weights for {missing[:5]}{'...' if len(missing) > 5 else ''}")
    return count


def checkpoint_shapes(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of a Hugging Face checkpoint of this model (unsharded)."""
    h, i, dh = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q, kv = spec.num_attention_heads * dh, spec.num_key_value_heads * dh
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (spec.vocab_size, h))]
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                   (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q))]
        if spec.qkv_bias:
            shapes += [(p + "self_attn.q_proj.bias", (q,)), (p + "self_attn.k_proj.bias", (kv,)),
                       (p + "self_attn.v_proj.bias", (kv,))]
        if spec.o_bias:
            shapes.append((p + "self_attn.o_proj.bias", (h,)))
        shapes += [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                   (p + "mlp.down_proj.weight", (h, i))]
        if spec.mlp_bias:
            shapes += [(p + "mlp.gate_proj.bias", (i,)), (p + "mlp.up_proj.bias", (i,)),
                       (p + "mlp.down_proj.bias", (h,))]
        shapes += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    shapes.append(("model.norm.weight", (h,)))
    if not spec.tie_word_embeddings:
        shapes.append(("lm_head.weight", (spec.vocab_size, h)))
    return shapes


def dummy_weights(spec: ModelSpec, seed: int = 0, std: float = 0.02,
                  device: torch.device | str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Deterministic random checkpoint tensors (norm weights 1, biases and matrices N(0, std))."""
    for name, shape in checkpoint_shapes(spec):
        if "layernorm" in name or name == "model.norm.weight":
            yield name, torch.ones(shape, device=device)
            continue
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        yield name, torch.randn(shape, generator=gen, device=device) * std


def checkpoint_dir(config) -> str | None:
    """The directory an ``EngineConfig``'s weights (and an FP8 cache's k/v scales) are read from; None: dummy
    weights ("auto": safetensors when the model directory has them or no ``hf_config`` stands in for it)."""
    load_format = config.load_format
    if load_format == "auto":
        has_weights = os.path.isdir(config.model) and any(f.endswith(".safetensors") for f in os.listdir(config.model))
        load_format = "safetensors" if has_weights or config.hf_config is None else "dummy"
    return config.model if load_format == "safetensors" else None


def build_model(spec: ModelSpec, max_position: int, dtype: torch.dtype, device: torch.device, model_dir: str,
                load_format: str, seed: int, parallel: ParallelState = SINGLE) -> nn.Module:
    """The model of ``spec`` built on ``device`` in ``dtype``, in eval mode, its weights loaded
    (``load_model_weights``): the target's (model_runner.py) and a draft model's (spec_decode/draft_model.py)."""
    cls = get_model_class(spec.architecture)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(spec, max_position, parallel)
    finally:
        torch.set_default_dtype(default_dtype)
    model.to(device).eval()
    load_model_weights(model, model_dir, load_format, seed, device)
    return model


def load_model_weights(model: nn.Module, model_dir: str, load_format: str, seed: int,
                       device: torch.device) -> None:
    """Load ``model``'s weights per ``load_format`` ("auto" | "safetensors" | "dummy"), logging the time."""
    start = time.perf_counter()
    if load_format == "dummy":
        count = load_weights(model, dummy_weights(model.spec, seed, device=device))
    else:
        count = load_weights(model, safetensors_weights(model_dir))
    logger.info("loaded %d %s tensors in %.2f s", count, "dummy" if load_format == "dummy" else "checkpoint",
                time.perf_counter() - start)
