"""Rejection sampling of n-gram drafts that keeps the target's distribution exactly (vLLM's rejection sampler,
for a proposer whose draft distribution is a point mass on the proposed token).

For draft d at a position whose target distribution is p (after temperature, min_p, top-k and top-p, as the
sampler applies them): accept d with probability p(d); else draw from p with d removed, renormalized
(``max(p - q, 0)`` for q the point mass at d). Every emitted token then has distribution p. After the last
accepted draft the step's own sample at the next position (the sampler's, from p there) is the bonus token.
"""

from __future__ import annotations

import torch
from kvmesh.replica.sample.penalties import apply_min_p
from kvmesh.replica.sample.sampler import apply_top_k_top_p
from kvmesh.replica.serving.sampling_params import SamplingParams


def target_probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from for ``logits`` [K, V] of one request: probs [K, V]."""
    rows, vocab = logits.shape
    x = logits.to(torch.float32) / sp.temperature
    if sp.min_p:
        x = apply_min_p(x, x.new_full((rows,), sp.min_p))
    k = torch.full((rows,), sp.top_k, device=x.device) if 0 < sp.top_k < vocab else None
    p = x.new_full((rows,), sp.top_p) if sp.top_p < 1.0 else None
    return torch.softmax(apply_top_k_top_p(x, k, p), dim=-1)


def rejection_targets(logits: torch.Tensor, drafts: list[int], sp: SamplingParams,
                      generator: torch.Generator) -> list[int]:
    """Per draft position: the draft itself where it is accepted, else a token drawn from the residual
    distribution (never the draft); positions after the first rejection are not read."""
    probs = target_probs(logits, sp)  # [K, V]
    draft = torch.tensor(drafts, device=probs.device)
    rows = torch.arange(len(drafts), device=probs.device)
    u = torch.rand(len(drafts), generator=generator, device=probs.device)
    accepted = (u < probs[rows, draft]).tolist()
    residual = probs.clone()
    residual[rows, draft] = 0.0
    empty = residual.sum(dim=-1) <= 0  # p was the point mass at d itself: d is always accepted there
    residual[empty] = 1.0
    resampled = torch.multinomial(residual, 1, generator=generator).squeeze(1).tolist()
    return [d if ok else r for d, ok, r in zip(drafts, accepted, resampled, strict=True)]
