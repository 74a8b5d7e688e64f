"""Draft models for speculative decoding tests: stories260K itself (it drafts what it then verifies: nearly every
draft is accepted) and a copy whose weights carry seeded noise (many drafts rejected; conftest.py's
``perturbed_draft``)."""

from __future__ import annotations

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
