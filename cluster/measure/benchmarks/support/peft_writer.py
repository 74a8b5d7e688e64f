"""A LoRA adapter for a Llama model written in PEFT's layout without peft: ``adapter_config.json`` and
``adapter_model.safetensors`` with random A and B (r, every projection), as ``peft``'s ``save_pretrained`` writes
them. The benchmarks make their adapters with it (peft is a test reference only; tests/cluster/test_peft_writer.py
holds that peft loads what it writes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections an adapter adapts (PEFT's module names for Llama)."""


def projection_shapes(model_dir: str | Path) -> dict[str, tuple[int, int]]:
    """Each target projection's (in_features, out_features), from the model's ``config.json``."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    kv = cfg.get("num_key_value_heads") or heads
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def write_lora_adapter(model_dir: str | Path, out: str | Path, seed: int, r: int = 8, std: float = 0.1) -> Path:
    """Write a PEFT LoRA adapter of ``model_dir`` at ``out`` (created): rank ``r``, alpha 2r, every projection of
    every layer, A and B drawn N(0, ``std``) from ``seed`` (B too: PEFT's zero B would change nothing)."""
    from safetensors.numpy import save_file

    model_dir, out = Path(model_dir), Path(out)
    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    shapes = projection_shapes(model_dir)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(layers):
        for name, (fan_in, fan_out) in shapes.items():
            block = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((r, fan_in)) * std).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, r)) * std).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir), "r": r,
              "lora_alpha": 2 * r, "lora_dropout": 0.0, "target_modules": sorted(TARGETS), "bias": "none",
              "use_rslora": False, "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None,
              "rank_pattern": {}, "alpha_pattern": {}, "inference_mode": True}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out
