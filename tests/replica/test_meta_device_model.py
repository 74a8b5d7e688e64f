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


def test_a_step_mixing_the_base_and_an_adapter_runs_on_the_meta_device(tmp_path):
    """LoRA (replica/lora/): the wrapped projections' slots, an adapter written into one, the step's mapping from the
    runner's input batch and the gathered update in every layer -- every tensor on meta (the torch path)."""
    import json

    from kvmesh.cluster.measure.benchmarks.support.peft_writer import write_lora_adapter
    from kvmesh.replica.lora.manager import LoRAManager
    from kvmesh.replica.serving.lora_request import LoRARequest
    from kvmesh.replica.step.scheduler_output import SchedulerOutput
    from kvmesh.replica.worker.input_batch import InputBatch

    spec, block_size = SPECS["LlamaForCausalLM"], 16
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "architectures": [spec.architecture]}))
    adapter = LoRARequest("tiny", 1, str(write_lora_adapter(tmp_path, tmp_path / "tiny", seed=0, r=4)))
    model = build_on(META, spec)
    lora = LoRAManager(model, spec, model.packed_modules_mapping, 2, 8, 2, META, torch.float32)
    lora.add_lora(adapter)
    backend = get_attn_backend("torch", META, torch.float32)
    kv = torch.zeros(spec.num_hidden_layers, *backend.kv_cache_shape(8, block_size, 2, 8), device=META)
    for i, attn in enumerate(model.attention_layers()):
        attn.backend, attn.kv_cache = backend, kv[i]
    batch = InputBatch(4, 8, block_size, META)
    batch.loras.manager = lora
    greedy = SamplingParams(temperature=0.0)
    inputs = batch.prepare(SchedulerOutput([
        ScheduledRequest("base", list(range(1, 10)), 0, [5], True, greedy),
        ScheduledRequest("adapter", [7, 8, 9], 0, [1], True, greedy, lora_request=adapter),
    ], 12))
    mapping = inputs.lora_mapping
    assert mapping is not None and mapping.num_reqs == 2
    assert [t.device for t in (mapping.req_slots, mapping.query_start_loc, *[g for _, g in mapping.token_groups])] \
        == [META] * (2 + len(mapping.token_groups))
    assert all(t.device == META for layer in lora.state.layers.values() for t in (layer.lora_a, layer.lora_b))
    lora.state.mapping = mapping
    with torch.inference_mode():
        hidden = model(inputs.input_ids, inputs.positions, backend.build(inputs.common))
    assert hidden.shape == (12, spec.hidden_size) and hidden.device == META
