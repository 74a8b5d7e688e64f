"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeds, min_tokens.

One pass over the [N, vocab] logits of the sampling rows. Random rows draw with the
"exponential race" (argmax of probs / Exp(1) noise == a sample from probs), so a seeded row only
needs its own noise row: it comes from a generator seeded by (seed, number of tokens generated so
far), which makes a seeded request's tokens independent of what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from kvmesh.replica.scheduler_output import ScheduledRequest

_MIX_A, _MIX_B, _MASK = 6364136223846793005, 1442695040888963407, (1 << 63) - 1


@dataclass(slots=True)
class SamplingMetadata:
    """Per-row sampling settings as tensors (row i = the i-th sampling request)."""

    temperature: torch.Tensor | None
    """[N] float32 (1.0 on greedy rows); None when every row is greedy."""
    greedy_rows: torch.Tensor | None
    """[N] bool: rows that take the argmax; None when every row is greedy."""
    top_k: torch.Tensor | None
    """[N] int64, vocab_size where disabled; None when no row uses top-k."""
    top_p: torch.Tensor | None
    """[N] float32, 1.0 where disabled; None when no row uses top-p."""
    generators: dict[int, torch.Generator]
    """Seeded rows -> their generator for this step."""
    banned: list[tuple[int, list[int]]]
    """(row, token ids) that must not be sampled yet (stop/EOS tokens before min_tokens)."""

    @property
    def all_greedy(self) -> bool:
        return self.temperature is None


def seeded_generator(seed: int, num_generated: int, device: torch.device) -> torch.Generator:
    """The generator of a seeded request's next token (depends only on seed and position)."""
    return torch.Generator(device=device).manual_seed((seed * _MIX_A + num_generated * _MIX_B + 1) & _MASK)


def build_sampling_metadata(reqs: Sequence[ScheduledRequest], vocab_size: int, eos_token_ids: Sequence[int],
                            device: torch.device) -> SamplingMetadata:
    """Collect the sampling requests' parameters into tensors (one Python pass over the requests)."""
    params = [r.sampling_params for r in reqs]
    banned = []
    for row, (r, sp) in enumerate(zip(reqs, params, strict=True)):
        if sp.min_tokens and len(r.output_token_ids) < sp.min_tokens:
            banned.append((row, list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(eos_token_ids))))
    if all(sp.greedy for sp in params):
        return SamplingMetadata(None, None, None, None, {}, banned)
    temperature = torch.tensor([1.0 if sp.greedy else sp.temperature for sp in params], dtype=torch.float32)
    greedy = torch.tensor([sp.greedy for sp in params], dtype=torch.bool)
    top_k = top_p = None
    if any(sp.top_k > 0 for sp in params):
        top_k = torch.tensor([sp.top_k if 0 < sp.top_k < vocab_size else vocab_size for sp in params]).to(device)
    if any(sp.top_p < 1.0 for sp in params):
        top_p = torch.tensor([sp.top_p for sp in params], dtype=torch.float32).to(device)
    generators = {
        row: seeded_generator(sp.seed, len(r.output_token_ids), device)
        for row, (r, sp) in enumerate(zip(reqs, params, strict=True))
        if sp.seed is not None and not sp.greedy
    }
    return SamplingMetadata(temperature.to(device), greedy.to(device), top_k, top_p, generators, banned)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Set logits outside each row's top-k / nucleus to -inf (logits [N, V], k [N], p [N])."""
    if k is None and p is None:
        return logits
    if p is None:  # top-k only: a threshold from topk, no full sort
        max_k = int(k.max())
        kth = logits.topk(max_k, dim=-1).values.gather(1, (k.clamp(max=max_k) - 1).unsqueeze(1))  # [N, 1]
        kth = kth.masked_fill((k >= logits.shape[-1]).unsqueeze(1), float("-inf"))
        return logits.masked_fill(logits < kth, float("-inf"))
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)  # ascending
    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.shape[1] - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(1)  # the low tail whose mass stays outside top_p
    top_p_mask[:, -1] = False  # always keep the most likely token
    logits_sort.masked_fill_(top_p_mask, float("-inf"))
    return logits.scatter(-1, logits_idx, logits_sort)


class Sampler:
    """logits [N, V] + SamplingMetadata -> token ids [N]."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator  # noise for unseeded random rows

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        logits = logits.to(torch.float32, copy=bool(md.banned))
        for row, token_ids in md.banned:
            logits[row, token_ids] = float("-inf")
        greedy = logits.argmax(dim=-1)
        if md.all_greedy:
            return greedy
        logits = logits / md.temperature.unsqueeze(1)
        logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
        probs = logits.softmax(dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for row, gen in md.generators.items():
            noise[row].exponential_(generator=gen)
        sampled = probs.div_(noise).argmax(dim=-1)
        return torch.where(md.greedy_rows, greedy, sampled)
