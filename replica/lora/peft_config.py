"""A PEFT LoRA adapter's ``adapter_config.json``, read and checked: what kvmesh serves and what it refuses.

kvmesh serves plain LoRA (``peft_type: LORA``) on the decoder's linear projections; scale ``lora_alpha / r``
(``lora_alpha / sqrt(r)`` with ``use_rslora``). Refused with a clear error: DoRA, LoRA biases, per-module
rank/alpha patterns, ``modules_to_save``, targets other than the projections, rank above ``max_lora_rank``, a
``lora_alpha`` that is not a finite positive number (JSON's ``Infinity`` and ``NaN`` parse as floats).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""PEFT module names kvmesh adapts (Hugging Face Llama names)."""
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class LoRAError(ValueError):
    """An adapter that cannot be served (bad directory, unsupported feature, rank too large): the message says why."""


@dataclass(frozen=True, slots=True)
class PEFTConfig:
    """What kvmesh reads of ``adapter_config.json``."""

    r: int
    """The adapter's rank."""
    lora_alpha: float
    """Its alpha: the update is scaled by ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA)."""
    use_rslora: bool
    """Rank-stabilized scaling."""
    target_modules: tuple[str, ...] | str
    """The module names it targets (or PEFT's regex string): checked against the tensors it holds."""

    @property
    def scale(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def read_peft_config(path: str, max_lora_rank: int) -> PEFTConfig:
    """``path/adapter_config.json`` read and checked; raises ``LoRAError`` naming what is wrong."""
    if not os.path.isdir(path):
        raise LoRAError(f"LoRA adapter path {path!r} is not a directory; give a PEFT directory "
                        f"({CONFIG_FILE} + {WEIGHTS_FILE})")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not os.path.isfile(os.path.join(path, name)):
            raise LoRAError(f"LoRA adapter {path!r} has no {name}; kvmesh loads PEFT directories "
                            f"({CONFIG_FILE} + {WEIGHTS_FILE})")
    try:
        with open(os.path.join(path, CONFIG_FILE)) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise LoRAError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not readable JSON: {e}") from None
    if not isinstance(raw, dict):
        raise LoRAError(f"LoRA adapter {path!r}: {CONFIG_FILE} must hold a JSON object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"LoRA adapter {path!r} is a {raw.get('peft_type')!r} adapter; kvmesh serves LORA only")
    refused = {"use_dora": "DoRA", "lora_bias": "LoRA biases", "rank_pattern": "per-module ranks (rank_pattern)",
               "alpha_pattern": "per-module alphas (alpha_pattern)", "modules_to_save": "modules_to_save",
               "layers_pattern": "layers_pattern", "layers_to_transform": "layers_to_transform"}
    for key, what in refused.items():
        if raw.get(key):
            raise LoRAError(f"LoRA adapter {path!r} uses {what} ({key}={raw[key]!r}), which kvmesh does not serve")
    if raw.get("bias", "none") != "none":
        raise LoRAError(f"LoRA adapter {path!r} trains biases (bias={raw['bias']!r}); kvmesh serves bias='none' only")
    if raw.get("fan_in_fan_out"):
        raise LoRAError(f"LoRA adapter {path!r} has fan_in_fan_out=true (Conv1D layers); kvmesh serves Linear layers")
    r = raw.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise LoRAError(f"LoRA adapter {path!r}: r must be a positive integer, got {r!r}")
    if r > max_lora_rank:
        raise LoRAError(f"LoRA adapter {path!r} has rank {r}, above max_lora_rank={max_lora_rank}; "
                        f"raise max_lora_rank to at least {r}")
    alpha = raw.get("lora_alpha", 8)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0:
        raise LoRAError(f"LoRA adapter {path!r}: lora_alpha must be a finite positive number, got {alpha!r}")
    targets = raw.get("target_modules") or ()
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(SUPPORTED_TARGETS))
        if unknown:
            raise LoRAError(f"LoRA adapter {path!r} targets {unknown}; kvmesh adapts {list(SUPPORTED_TARGETS)}")
        targets = tuple(targets)
    elif not isinstance(targets, str):
        raise LoRAError(f"LoRA adapter {path!r}: target_modules must be a list or a string, got {targets!r}")
    return PEFTConfig(r=r, lora_alpha=float(alpha), use_rslora=bool(raw.get("use_rslora")), target_modules=targets)
