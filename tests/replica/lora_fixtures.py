"""Real PEFT adapters of stories260K made with peft (random A and B, r=8, every projection) and their reference
generations from transformers + peft; shared by the LoRA tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[1, 403, 407, 261, 378, 80, 90], [1, 365, 267, 299, 272, 266, 412, 288, 302, 271, 411, 39, 290]]
MAX_TOKENS = 10


@dataclass
class Reference:
    tokens: list[int]
    logprobs: list[float]


def make_adapter(base: Path, out: Path, seed: int, r: int = 8, **config) -> torch.nn.Module:
    """Save a PEFT adapter with random factors (B too: PEFT's zero init would change nothing) at ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = get_peft_model(hf, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=TARGETS,
                                          **config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(out)
    return model.eval()


@torch.inference_mode()
def greedy(model: torch.nn.Module, prompt: list[int], n: int = MAX_TOKENS) -> Reference:
    """Greedy tokens and their logprobs, by full forwards (no cache), on one thread: the model is tiny, and
    torch's threads spinning on a busy machine made these forwards 60x slower."""
    ids, logprobs, threads = list(prompt), [], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    finally:
        torch.set_num_threads(threads)
    return Reference(ids[len(prompt):], logprobs)
