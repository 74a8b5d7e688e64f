"""Rejection sampling of drafts that keeps the target's distribution exactly (vLLM's rejection sampler).

For draft d drawn from the draft distribution q at a position whose target distribution is p (after
temperature, min_p, top-k and top-p, as the sampler applies them): accept d with probability min(1, p(d)/q(d));
else draw from ``max(p - q, 0)`` renormalized. Every emitted token then has distribution p. An n-gram draft's
q is the point mass at d (accept with p(d), else draw from p with d removed); a draft model's q is its own
distribution (draft_proposer.py). After the last accepted draft the step's own sample at the next position
(the sampler's, from p there) is the bonus token.

Where the uniforms come from is the sampler's rule (sample/draws.py): a seeded request's acceptance and residual
draws at output position n are keyed by its seed and n (``ACCEPT_DRAW``, ``RESIDUAL_DRAW``), so its tokens do
not depend on what shares its batch; an unseeded request's come from the runner's generator.
"""

from __future__ import annotations

import torch
from kvmesh.replica.sample.draws import ACCEPT_DRAW, RESIDUAL_DRAW, purpose_keys, seeded_uniforms
from kvmesh.replica.sample.fixed_sampler import draw_in_order
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


def verify_uniforms(sp: SamplingParams, num_generated: int, num: int, generator: torch.Generator,
                    device: torch.device) -> torch.Tensor:
    """[2, num] uniforms of one request's drafts (row 0: acceptance, row 1: residual draws); draft j is its
    output position ``num_generated + j``. Seeded: from its own keys; else from ``generator``."""
    if sp.seed is None:
        return torch.rand((2, num), generator=generator, device=device)
    keys = purpose_keys(sp.seed, num_generated, num, ACCEPT_DRAW) + \
        purpose_keys(sp.seed, num_generated, num, RESIDUAL_DRAW)
    return seeded_uniforms(torch.tensor(keys, dtype=torch.int64, device=device)).view(2, num)


def rejection_targets(logits: torch.Tensor, drafts: list[int], sp: SamplingParams,
                      uniforms: torch.Tensor, draft_probs: torch.Tensor | None = None) -> list[int]:
    """Per draft position: the draft itself where it is accepted, else a token drawn from the residual
    distribution; positions after the first rejection are not read. ``uniforms`` [2, K]: verify_uniforms;
    ``draft_probs`` [K, V]: q of a draft model (None: the point mass at each draft)."""
    probs = target_probs(logits, sp)  # [K, V]
    draft = torch.tensor(drafts, device=probs.device)
    rows = torch.arange(len(drafts), device=probs.device)
    if draft_probs is None:
        q = torch.zeros_like(probs)
        q[rows, draft] = 1.0
    else:
        q = draft_probs.to(probs.device, torch.float32)
    u = uniforms[0].to(probs.device)
    accepted = (u * q[rows, draft] < probs[rows, draft]).tolist()  # u < p(d) / q(d)
    residual = (probs - q).clamp_(min=0.0)
    empty = residual.sum(dim=-1) <= 0  # p <= q everywhere, so p == q: d is always accepted there
    residual[empty] = probs[empty]
    resampled = draw_in_order(residual, uniforms[1].to(probs.device)).tolist()
    return [d if ok else r for d, ok, r in zip(drafts, accepted, resampled, strict=True)]
