"""PEFT adapters made in the test (random A and B) and transformers + peft's greedy run as the reference."""

from __future__ import annotations

from pathlib import Path

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""Every projection of a Llama decoder layer: the adapters adapt them all."""


def make_adapter(base_dir: Path, out_dir: Path, r: int = 8, seed: int = 0):
    """A LoRA adapter of rank ``r`` on every projection with random A and B (``init_lora_weights=False``: B is not
    zero, so the adapter changes the output), saved as a PEFT directory; returns the peft model (eval mode)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=r, target_modules=PROJECTIONS, init_lora_weights=False, lora_dropout=0.0)
    model = get_peft_model(base, config)
    model.save_pretrained(out_dir)
    return model.eval()


def greedy_reference(model, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens for ``prompt_ids`` and each chosen token's logprob (the raw distribution)."""
    import torch

    ids, logprobs = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(max_tokens):
            row = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)  # [vocab]
            token = int(row.argmax())
            ids.append(token)
            logprobs.append(float(row[token]))
    return ids[len(prompt_ids):], logprobs
