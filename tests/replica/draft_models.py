"""Model copies for tests. Draft models for speculative decoding: stories260K itself (it drafts what it then
verifies: nearly every draft is accepted) and a copy whose weights carry seeded noise (many drafts rejected;
conftest.py's ``perturbed_draft``). And stories260K cut to fewer layers (conftest.py's ``two_layer_stories``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

NOISE = 0.15
"""Noise added to every weight, as a fraction of each tensor's standard deviation."""


def perturbed_copy(src: Path, dst: Path, noise: float = NOISE, seed: int = 0) -> Path:
    """``src`` (a Hugging Face directory) copied to ``dst`` with noise on its weights; the tokenizer is the same."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copyfile(f, dst / f.name)
    gen = torch.Generator().manual_seed(seed)
    for f in src.glob("*.safetensors"):
        tensors = load_file(str(f))
        save_file({k: (v + noise * v.float().std() * torch.randn(v.shape, generator=gen)).to(v.dtype)
                   for k, v in tensors.items()}, str(dst / f.name))
    return dst


def draft_spec(path: Path, k: int = 4) -> dict:
    """``speculative_config`` of a draft model in vLLM's form (method inferred from ``model``)."""
    return {"model": str(path), "num_speculative_tokens": k}


def truncated_copy(src: Path, dst: Path, num_layers: int) -> Path:
    """``src`` (a Hugging Face directory) cut to its first ``num_layers`` decoder layers: the real embedding, final
    norm and head on fewer layers, for tests about kernels and launches, where every layer runs the same ones."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copyfile(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    kept = tuple(f"model.layers.{i}." for i in range(num_layers))
    for f in src.glob("*.safetensors"):
        tensors = load_file(str(f))
        save_file({k: v for k, v in tensors.items() if not k.startswith("model.layers.") or k.startswith(kept)},
                  str(dst / f.name))
    return dst
