"""Every architecture kvmesh serves builds and runs a step under a non-CPU device context.

A GPU replica builds its model inside ``torch.device("cuda")``; a tensor made with an explicit
``device="cpu"`` (or none, outside the context) then meets GPU tensors and the first GPU start
crashes ("Expected all tensors to be on the same device"). The ``meta`` device fails the same
way on a CPU, so these tests catch that class of bug without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.model_config import ModelSpec
from kvmesh.replica.models import MODEL_REGISTRY, get_model_class
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest
from kvmesh.replica.worker.input_batch import prepare_inputs

META = torch.device("meta")
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=128)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}
SPECS = {
    "LlamaForCausalLM": ModelSpec(architecture="LlamaForCausalLM", **BASE),
    "LlamaForCausalLM-llama3-rope-tied": ModelSpec(architecture="LlamaForCausalLM", rope_scaling=LLAMA3_SCALING,
                                                   tie_word_embeddings=True, **BASE),
    "LlamaForCausalLM-linear-rope": ModelSpec(architecture="LlamaForCausalLM",
                                              rope_scaling={"rope_type": "linear", "factor": 2.0}, **BASE),
    "MistralForCausalLM": ModelSpec(architecture="MistralForCausalLM", **BASE),
    "Qwen2ForCausalLM": ModelSpec(architecture="Qwen2ForCausalLM", qkv_bias=True, **BASE),
}


def test_every_registered_architecture_is_covered():
    assert {name.split("-")[0] for name in SPECS} == set(MODEL_REGISTRY)


def build_on(device: torch.device, spec: ModelSpec) -> torch.nn.Module:
    with torch.device(device):
        return get_model_class(spec.architecture)(spec, 128)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_model_builds_under_a_non_cpu_device_context(name):
    model = build_on(META, SPECS[name])
    on_cpu = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device != META]
    assert on_cpu == []


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_mixed_step_runs_end_to_end_on_the_meta_device(name):
    """Decode + cached-prefix prefill + fresh prefill through the torch backend, every tensor on meta."""
    spec, block_size = SPECS[name], 16
    model = build_on(META, spec)
    backend = get_attn_backend("torch", META, torch.float32)
    kv = torch.zeros(spec.num_hidden_layers, *backend.kv_cache_shape(8, block_size, 2, 8), device=META)
    for i, attn in enumerate(model.attention_layers()):
        attn.backend, attn.kv_cache = backend, kv[i]
    greedy = SamplingParams(temperature=0.0)
    inputs = prepare_inputs([
        ScheduledRequest("decode", [5], block_size + 3, [3, 4], True, greedy, [1]),
        ScheduledRequest("fresh", list(range(1, 10)), 0, [5], True, greedy),
        ScheduledRequest("prefix-hit", [7, 8, 9], block_size, [1, 2], True, greedy),
    ], block_size, META)
    with torch.inference_mode():
        hidden = model(inputs.input_ids, inputs.positions, backend.build(inputs.common))
        logits = model.compute_logits(hidden[inputs.logits_indices])
    assert hidden.shape == (13, spec.hidden_size) and hidden.device == META
    assert logits.shape == (3, spec.vocab_size) and logits.device == META
