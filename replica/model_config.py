"""From a Hugging Face config to the few numbers our Llama-family model needs (``ModelSpec``).

transformers is only used to *read* configs here (``AutoConfig``), never to run the model.
transformers 5.x keeps RoPE settings in ``config.rope_parameters`` ({"rope_type", "rope_theta",
"factor", ...}); older configs have ``rope_theta`` + ``rope_scaling``: both are accepted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TypedDict

import torch
from kvmesh.replica.serving.json_types import JSONObject

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class RopeScaling(TypedDict, total=False):
    """RoPE parameters beyond the base, as Hugging Face configs write them (empty: the default RoPE)."""

    rope_type: str
    """One of ``SUPPORTED_ROPE_TYPES``."""
    factor: float
    """How much longer the context is than the one trained for (linear, llama3)."""
    low_freq_factor: float
    """llama3: wavelengths above ``original_max_position_embeddings / low_freq_factor`` are scaled fully."""
    high_freq_factor: float
    """llama3: wavelengths below ``original_max_position_embeddings / high_freq_factor`` are kept."""
    original_max_position_embeddings: int
    """llama3: the context length the model was pre-trained for."""
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape and numerics of a Llama-family decoder (unsharded, whole-model numbers)."""

    architecture: str
    """HF architecture name, one of SUPPORTED_ARCHITECTURES."""
    vocab_size: int
    """Rows of the embedding / lm head."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """K/V heads (GQA when fewer than query heads)."""
    head_dim: int
    """Width of one head."""
    rms_norm_eps: float
    """RMSNorm epsilon."""
    rope_theta: float
    """RoPE base."""
    rope_scaling: RopeScaling = field(default_factory=dict)
    """RoPE parameters beyond the base: {"rope_type": "llama3"|"linear", "factor", ...}; empty = default."""
    max_position_embeddings: int = 2048
    """Context length the model was trained for."""
    tie_word_embeddings: bool = False
    """lm_head shares the embedding matrix."""
    qkv_bias: bool = False
    """q/k/v projections have a bias (Qwen2; Llama with attention_bias)."""
    o_bias: bool = False
    """o projection has a bias (Llama with attention_bias)."""
    mlp_bias: bool = False
    """gate/up/down projections have a bias (Llama with mlp_bias)."""
    sliding_window: int | None = None
    """Sliding-window size the model declares (not applied: attention here is always full)."""
    dtype: str = "float32"
    """The checkpoint's dtype name."""
    eos_token_ids: tuple[int, ...] = ()
    """Token ids that end generation."""

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not supported; use one of "
                             f"{SUPPORTED_ARCHITECTURES}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported; use one of {SUPPORTED_ROPE_TYPES}")


def load_hf_config(model: str, hf_config: JSONObject | None = None, hf_overrides: JSONObject | None = None):
    """The model's ``PretrainedConfig``: from the ``hf_config`` dict if given, else read from ``model``."""
    from transformers import AutoConfig

    if hf_config is not None:
        cfg = dict(hf_config)
        model_type = cfg.pop("model_type", "llama")
        config = AutoConfig.for_model(model_type, **cfg)
    elif os.path.isdir(model) and not os.path.exists(os.path.join(model, "config.json")):
        raise FileNotFoundError(f"{model} has no config.json; pass a Hugging Face model directory")
    else:
        config = AutoConfig.from_pretrained(model)
    for key, value in (hf_overrides or {}).items():
        setattr(config, key, value)
    return config


def _rope_settings(hf_config) -> tuple[float, RopeScaling]:
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params and "full_attention" not in params:
        params = dict(params)
    else:  # transformers 4.x layout
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    theta = float(params.pop("rope_theta"))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    if params.get("rope_type", "default") == "default":
        params = {}
    return theta, params


def spec_from_hf_config(hf_config) -> ModelSpec:
    """Translate a transformers config into our ``ModelSpec`` (raises for unsupported models)."""
    archs = getattr(hf_config, "architectures", None) or []
    model_type = getattr(hf_config, "model_type", "llama")
    default_arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    arch = archs[0] if archs else default_arch.get(model_type, model_type)
    num_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    theta, scaling = _rope_settings(hf_config)
    is_qwen2 = arch == "Qwen2ForCausalLM"
    attention_bias = bool(getattr(hf_config, "attention_bias", False))
    eos = getattr(hf_config, "eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, list | tuple) else (() if eos is None else (int(eos),))
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "float32"
    dtype = str(dtype).removeprefix("torch.")
    return ModelSpec(
        architecture=arch,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_hidden_layers=hf_config.num_hidden_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=getattr(hf_config, "max_position_embeddings", 2048),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=is_qwen2 or attention_bias,
        o_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
        sliding_window=getattr(hf_config, "sliding_window", None),
        dtype=dtype if dtype in TORCH_DTYPES else "float32",
        eos_token_ids=eos_ids,
    )


def resolve_dtype(requested: str, spec: ModelSpec, device: torch.device) -> torch.dtype:
    """The dtype to run in: the requested one, or for "auto" the checkpoint's (float32 on CPU)."""
    if requested != "auto":
        return TORCH_DTYPES[requested]
    if device.type == "cpu":
        return torch.float32
    return TORCH_DTYPES.get(spec.dtype, torch.bfloat16) if spec.dtype != "float32" else torch.bfloat16


def eos_token_ids(model: str, from_config: tuple[int, ...]) -> list[int]:
    """EOS ids of the model config plus those of generation_config.json (when the directory has one)."""
    ids = list(from_config)
    path = os.path.join(model, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        for t in eos if isinstance(eos, list) else [eos] if eos is not None else []:
            if t not in ids:
                ids.append(t)
    return ids
