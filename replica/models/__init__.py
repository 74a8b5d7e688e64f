"""Model registry: HF architecture name -> our implementation."""

from __future__ import annotations

from kvmesh.replica.models.llama import LlamaForCausalLM

MODEL_REGISTRY = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}


def get_model_class(architecture: str):
    if architecture not in MODEL_REGISTRY:
        raise ValueError(f"architecture {architecture!r} is not supported; use one of {sorted(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[architecture]
