"""Our model's fp32 logits match Hugging Face transformers' forward on the same weights."""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest
from kvmesh.replica.worker.input_batch import prepare_inputs
from kvmesh.replica.worker.model_runner import ModelRunner

ATOL = 2e-5
GREEDY = SamplingParams(temperature=0.0)
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, initializer_range=0.1)
CONFIGS = {
    "llama_gqa": dict(model_type="llama", architectures=["LlamaForCausalLM"], **SMALL),
    "llama_tied_bias": dict(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=True,
                            attention_bias=True, mlp_bias=True, **SMALL),
    "qwen2_qkv_bias": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], **SMALL),
    "llama3_rope_scaling": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], **SMALL,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None, **SMALL),
}


def runner_for(path) -> ModelRunner:
    # on the CPU on every machine: logits within ATOL of transformers' CPU forward, closer than float32 on
    # another device's kernels promises
    return ModelRunner(EngineConfig(model=str(path), dtype="float32", device="cpu", kv_cache_memory=1 << 22))


@torch.inference_mode()
def all_logits(runner: ModelRunner, reqs: list[ScheduledRequest]) -> dict[str, torch.Tensor]:
    """Logits of every token of the step, per request (rows in query order)."""
    inputs = prepare_inputs(reqs, runner.block_size, runner.device)
    hidden = runner.model(inputs.input_ids, inputs.positions, runner.attn_backend.build(inputs.common))
    logits = runner.model.compute_logits(hidden)
    ordered = sorted(reqs, key=lambda r: len(r.token_ids) != 1)
    qsl = inputs.common.query_start_loc_cpu
    return {r.request_id: logits[qsl[i]:qsl[i + 1]] for i, r in enumerate(ordered)}


@torch.inference_mode()
def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    return hf_model(torch.tensor([token_ids])).logits[0]


def check_prefill_then_decode(path, hf_model, vocab: int) -> None:
    """Two prompts prefilled together, then two decode steps batched together, all vs transformers."""
    runner = runner_for(path)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (37, 21)]
    blocks = [list(range(1, 9)), list(range(9, 17))]
    reqs = [ScheduledRequest(f"r{i}", p, 0, blocks[i], True, GREEDY) for i, p in enumerate(prompts)]
    got = all_logits(runner, reqs)
    for i, p in enumerate(prompts):
        torch.testing.assert_close(got[f"r{i}"], hf_logits(hf_model, p), atol=ATOL, rtol=1e-4)
    seqs = [list(p) for p in prompts]
    for _ in range(2):
        nxt = [int(torch.randint(3, vocab, (1,), generator=gen)) for _ in seqs]
        reqs = [ScheduledRequest(f"r{i}", [nxt[i]], len(s), blocks[i], True, GREEDY) for i, s in enumerate(seqs)]
        got = all_logits(runner, reqs)
        for i, s in enumerate(seqs):
            s.append(nxt[i])
            torch.testing.assert_close(got[f"r{i}"][0], hf_logits(hf_model, s)[-1], atol=ATOL, rtol=1e-4)


def test_stories260k_logits_match_transformers(stories_path):
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    check_prefill_then_decode(stories_path, hf_model, 512)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_config_logits_match_transformers(name, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(CONFIGS[name])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms and biases start at 1/0; randomize them so they are checked too
        for n, p in hf_model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    hf_model.save_pretrained(tmp_path)
    check_prefill_then_decode(tmp_path, hf_model, config.vocab_size)
