"""Weight loading: streaming safetensors slices, packed q/k/v and gate/up, dummy weights, errors."""

from __future__ import annotations

import time

import pytest
import torch
from kvmesh.replica.distributed.parallel_state import ParallelState
from kvmesh.replica.layers.linear import narrow
from kvmesh.replica.model_config import ModelSpec, load_hf_config, spec_from_hf_config
from kvmesh.replica.models.llama import LlamaForCausalLM
from kvmesh.replica.worker.weights import checkpoint_shapes, dummy_weights, load_weights, safetensors_weights
from safetensors.torch import save_file

SPEC = ModelSpec(architecture="LlamaForCausalLM", vocab_size=40, hidden_size=16, intermediate_size=24,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                 rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64, qkv_bias=True)


# A small GQA Llama, as ``EngineConfig(load_format="dummy", hf_config=...)`` takes it.
GQA_LLAMA_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1408, "vocab_size": 32000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}


def build(spec=SPEC, parallel=ParallelState()):
    return LlamaForCausalLM(spec, 64, parallel)


def test_safetensors_slices_read_only_the_requested_rows(tmp_path):
    w = torch.arange(24.0).view(6, 4)
    save_file({"w": w}, tmp_path / "model.safetensors")
    [(name, sl)] = list(safetensors_weights(str(tmp_path)))
    assert name == "w"
    torch.testing.assert_close(narrow(sl, 0, 2, 3), w[2:5])
    torch.testing.assert_close(narrow(sl, 1, 1, 2), w[:, 1:3])


def test_checkpoint_loads_into_fused_parameters(tmp_path):
    tensors = dict(dummy_weights(SPEC, seed=3))
    half = len(tensors) // 2  # a sharded checkpoint: two files
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[:half]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in names[half:]}, tmp_path / "model-00002-of-00002.safetensors")
    model = build()
    assert load_weights(model, safetensors_weights(str(tmp_path))) == len(tensors)
    attn = model.model.layers[1].self_attn.qkv_proj
    expected = torch.cat([tensors[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    torch.testing.assert_close(attn.weight, expected)
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight
    torch.testing.assert_close(gate_up, torch.cat([tensors["model.layers.0.mlp.gate_proj.weight"],
                                                   tensors["model.layers.0.mlp.up_proj.weight"]]))


def test_dummy_weights_are_deterministic_and_tp_shards_agree():
    a, b = build(), build()
    load_weights(a, dummy_weights(SPEC, seed=1))
    load_weights(b, dummy_weights(SPEC, seed=1))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    r1 = build(parallel=ParallelState(1, 2))
    load_weights(r1, dummy_weights(SPEC, seed=1))
    torch.testing.assert_close(r1.model.layers[0].mlp.down_proj.weight, a.model.layers[0].mlp.down_proj.weight[:, 12:])


def test_missing_or_unknown_tensors_are_reported():
    shapes = dict(dummy_weights(SPEC))
    del shapes["model.norm.weight"]
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_weights(build(), shapes.items())
    with pytest.raises(KeyError, match="mystery"):
        load_weights(build(), [("model.mystery.weight", torch.zeros(1))])


def test_tied_embeddings_share_one_matrix():
    spec = ModelSpec(**{**{f: getattr(SPEC, f) for f in SPEC.__dataclass_fields__}, "tie_word_embeddings": True})
    model = build(spec)
    assert "lm_head.weight" not in dict(checkpoint_shapes(spec))
    load_weights(model, dummy_weights(spec))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_bench_config_dummy_weights_build_quickly():
    spec = spec_from_hf_config(load_hf_config("bench", GQA_LLAMA_CONFIG))
    assert (spec.hidden_size, spec.num_hidden_layers, spec.num_key_value_heads) == (512, 8, 2)
    start = time.process_time()
    model = build(spec)
    load_weights(model, dummy_weights(spec))
    assert time.process_time() - start < 10.0  # CPU seconds, robust to a busy machine
