"""The whole model on the fused Triton path gives the reference path's logits (and transformers').

stories260K (a real tiny Llama: GQA 8/4 heads, head_dim 8) runs a prefill of two prompts and two
batched decode steps through the ModelRunner's model, once on the plain-torch layers (CPU) and
once with every ``CustomOp`` on its Triton kernel (the GPU if lent one, else Triton's interpreter).
"""

from __future__ import annotations

import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.layers.custom_op import force_triton
from kvmesh.replica.step.scheduler_output import ScheduledRequest
from kvmesh.replica.worker.model_runner import ModelRunner

from .test_model_hf_parity import GREEDY, all_logits, hf_logits

HF_ATOL = 2e-5  # as tests/replica/test_model_hf_parity.py


def runner_on(path, device: torch.device) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(path), dtype="float32", device=str(device),
                                    kv_cache_memory=1 << 22, num_kv_blocks=64))


def steps(vocab: int) -> list[list[ScheduledRequest]]:
    """A prefill of two prompts (37 and 21 tokens), then two decode steps of both."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (37, 21)]
    blocks = [list(range(1, 9)), list(range(9, 17))]
    out = [[ScheduledRequest(f"r{i}", list(p), 0, blocks[i], True, GREEDY) for i, p in enumerate(prompts)]]
    for _ in range(2):
        nxt = [int(torch.randint(3, vocab, (1,), generator=gen)) for _ in prompts]
        out.append([ScheduledRequest(f"r{i}", [nxt[i]], len(p), blocks[i], True, GREEDY)
                    for i, p in enumerate(prompts)])
        for p, t in zip(prompts, nxt, strict=True):
            p.append(t)
    return out


def test_stories260k_fused_path_logits_equal_reference_and_transformers(stories_path, triton_device):
    from transformers import AutoModelForCausalLM

    reference = runner_on(stories_path, torch.device("cpu"))
    fused = runner_on(stories_path, triton_device)
    force_triton(fused.model)
    hf_model = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    seqs = {"r0": [], "r1": []}
    for step in steps(reference.vocab_size):
        want, got = all_logits(reference, step), all_logits(fused, step)
        for req in step:
            seqs[req.request_id] += req.token_ids
            torch.testing.assert_close(got[req.request_id].cpu(), want[req.request_id], atol=1e-5, rtol=1e-5)
            expected = hf_logits(hf_model, seqs[req.request_id])[-len(req.token_ids):]
            torch.testing.assert_close(got[req.request_id].cpu(), expected, atol=HF_ATOL, rtol=1e-4)


def test_the_fused_path_runs_under_the_meta_device(triton_device):
    """The kernels' torch ops have meta implementations, so the fused model traces shapes without running
    a kernel (what torch.compile's fake tensors and the meta-device tests need)."""
    from kvmesh.replica.attention.backend import get_attn_backend
    from kvmesh.replica.worker.input_batch import prepare_inputs

    from .test_meta_device_model import META, SPECS, build_on

    spec = SPECS["Qwen2ForCausalLM"]
    model = build_on(META, spec)
    force_triton(model)
    backend = get_attn_backend("torch", META, torch.float32)
    kv = torch.zeros(spec.num_hidden_layers, *backend.kv_cache_shape(8, 16, 2, 8), device=META)
    for i, attn in enumerate(model.attention_layers()):
        attn.backend, attn.kv_cache = backend, kv[i]
    inputs = prepare_inputs([ScheduledRequest("decode", [5], 19, [3, 4], True, GREEDY),
                             ScheduledRequest("fresh", list(range(1, 10)), 0, [5], True, GREEDY)], 16, META)
    with torch.inference_mode():
        hidden = model(inputs.input_ids, inputs.positions, backend.build(inputs.common))
    assert hidden.shape == (10, spec.hidden_size) and hidden.device == META
