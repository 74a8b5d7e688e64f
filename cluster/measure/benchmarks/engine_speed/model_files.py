"""The preset's model on disk: random weights saved once as bf16 safetensors, reused by later runs.

    <cache_dir>/<preset>/config.json, model.safetensors, kvmesh-bench.json (what made it)

No tokenizer is saved: the engines are fed token ids (``LLMEngine(skip_tokenizer_init=True)``) and
the HF baseline takes tensors of ids.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.engine_speed.presets import Preset

MARKER = "kvmesh-bench.json"


def ensure_model(preset: Preset, cache_dir: str, seed: int) -> Path:
    """The directory of ``preset``'s random bf16 weights, made (once per preset and seed) if missing."""
    root = Path(cache_dir).expanduser()
    path = root / f"{preset.name}-seed{seed}"
    made_by = {"preset": preset.config, "seed": seed}
    marker = path / MARKER
    if marker.exists() and json.loads(marker.read_text()) == json.loads(json.dumps(made_by)):
        return path
    root.mkdir(parents=True, exist_ok=True)
    print(f"[engine-speed] making random bf16 weights of preset {preset.name!r} in {path} (once)", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{preset.name}-", dir=root))
    try:
        _save_random_llama(preset, seed, tmp)
        (tmp / MARKER).write_text(json.dumps(made_by, indent=2))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)  # atomic: a run killed midway leaves no half-written model behind
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _save_random_llama(preset: Preset, seed: int, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = preset.config
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)


def weight_file_bytes(model_dir: str | Path) -> int:
    """Bytes of the safetensors files of a model directory."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
