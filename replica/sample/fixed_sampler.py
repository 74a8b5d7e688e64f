"""Sampling with fixed ops: what a decode CUDA graph holds, and the draws the eager sampler shares with it.

A random row draws by inverse CDF with one uniform u (draws.py) over weights in a fixed order:

    plain row (no top-k/top-p)   probs = softmax(logits / T) in vocabulary order
    top-k / top-p row            the same probs sorted descending (sort, or topk for a shortlist), then
        e[j]   = probs[j] if j < k else 0                      (top-k)
        c      = cumsum(e)                                     (sequential on the CPU: a shortlist of K
        z      = c[-1] if the row has a top-k else 1              columns gives the first K sums exactly)
        keep j = c[j] - e[j] < p * z, or j == 0                (mass of the more likely tokens below top_p)
        w      = e * keep
    token = first j with cumsum(w)[j] > u * cumsum(w)[-1]       (a token of weight 0 is never chosen)

Every step is row-local (softmax and cumsum work row by row), so a row's token depends on its own
logits, settings and key only: the eager sampler's shortlist over K columns and this module's full sort
over V give the same token (on CPU bit for bit; ties between equal probabilities may order differently).

``sample_fixed`` runs both draws on every row and picks per row by masks -- shapes and control flow depend
on no per-step host fact, so a CUDA graph can replay it with the settings in its static inputs (one graph
per variant: RANDOM leaves out the sort when no row has top-k/top-p, TOP_K_TOP_P holds both draws, LOGPROBS
adds every row's logprobs at the widest width, packed with the tokens for one copy back: ``sample_and_pack``):
temperature (0: greedy), top_k (>= the vocabulary size: none), top_p (1: none), the draw keys
(``fixed_settings`` writes them; rows with logit_bias or min_tokens bans take the eager sampler).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from kvmesh.replica.sample.draws import RandomDraws, seeded_uniforms
from kvmesh.replica.sample.logprobs import pack_logprobs
from kvmesh.replica.serving.sampling_params import MAX_LOGPROBS, SamplingParams


def draw_in_order(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: weights [N, K] >= 0 (need not be normalized), u [N] uniform in [0, 1) -> indices [N]."""
    cdf = weights.cumsum(dim=-1)  # [N, K]
    target = (u * cdf[:, -1]).unsqueeze(1)  # [N, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return idx.clamp_(max=weights.shape[-1] - 1)


def truncated_weights(sorted_probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k / nucleus weights w [N, K] of probabilities sorted descending (the first K of each row's V),
    and whether each row's kept set ends inside those K columns ([N] bool; always when K = V)."""
    pos = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device)  # [K]
    e = sorted_probs.masked_fill(pos >= top_k.unsqueeze(1), 0.0)  # [N, K]
    c = e.cumsum(dim=-1)
    limited = top_k < vocab_size
    z = torch.where(limited, c[:, -1], 1.0)  # [N] the mass top_p is a share of
    mass = (top_p * z).unsqueeze(1)  # [N, 1]
    keep = ((c - e) < mass) | (pos == 0)
    covered = limited | (c[:, -1] >= mass.squeeze(1)) | (sorted_probs.shape[-1] == vocab_size)
    return e.masked_fill(~keep, 0.0), covered


RANDOM, TOP_K_TOP_P, LOGPROBS = "random", "top_k_top_p", "logprobs"
"""The variants: random and greedy rows only; top-k / top-p rows too (a [B, V] sort); that and logprobs."""


def sample_fixed(logits: torch.Tensor, greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, keys: torch.Tensor, variant: str = TOP_K_TOP_P) -> torch.Tensor:
    """logits [B, V] float32, their argmax ``greedy`` [B], temperature [B] float32 (0: greedy row), top_k [B]
    int64 (>= V: none), top_p [B] float32 (1: none), keys [B] int64 -> tokens [B] int64 (module docstring).
    ``variant`` RANDOM ignores top_k and top_p (``fixed_settings`` picks it only when no row has them)."""
    vocab = logits.shape[-1]
    is_greedy = temperature == 0
    probs = torch.softmax(logits / torch.where(is_greedy, 1.0, temperature).unsqueeze(1), dim=-1)  # [B, V]
    u = seeded_uniforms(keys)  # [B]
    plain = draw_in_order(probs, u)
    if variant == RANDOM:
        return torch.where(is_greedy, greedy, plain)
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [B, V]
    weights, _ = truncated_weights(sorted_probs, top_k, top_p, vocab)
    truncated = order.gather(1, draw_in_order(weights, u).unsqueeze(1)).squeeze(1)
    sampled = torch.where((top_k < vocab) | (top_p < 1.0), truncated, plain)
    return torch.where(is_greedy, greedy, sampled)


def sample_and_pack(logits: torch.Tensor, greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor, keys: torch.Tensor, variant: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sample_fixed``'s tokens [B] and, for LOGPROBS, every row's raw logprobs at MAX_LOGPROBS packed as
    ``pack_logprobs`` does [B, 2 (1 + MAX_LOGPROBS) + 1] float64 -- column 0 is the token id, so that one copy
    brings back tokens and logprobs (None for the other variants)."""
    tokens = sample_fixed(logits, greedy, temperature, top_k, top_p, keys, RANDOM if variant == RANDOM else TOP_K_TOP_P)
    if variant != LOGPROBS:
        return tokens, None
    return tokens, pack_logprobs(logits, MAX_LOGPROBS, tokens, logits.logsumexp(dim=-1, keepdim=True))


NO_TOP_K = 1 << 62
"""top_k of a row without one (any value >= the vocabulary size means none)."""


def fixed_settings(params: Sequence[SamplingParams], num_generated: Sequence[int], draws: RandomDraws
                   ) -> tuple[str, tuple[np.ndarray, ...]] | None:
    """The variant and the rows' (temperature, top_k, top_p, draw keys) for ``sample_and_pack``, or None when a
    row needs the eager sampler: logit_bias, allowed_token_ids, min_tokens still banning stop tokens (then no draw is
    counted), structured outputs (their mask is the step's); penalties and min_p, for now."""
    if any(sp.logit_bias or sp.allowed_token_ids or n < sp.min_tokens or sp.penalized or sp.min_p > 0.0
           or sp.structured_outputs is not None
           for sp, n in zip(params, num_generated, strict=True)):
        return None
    truncates = any(not sp.greedy and (sp.top_k > 0 or sp.top_p < 1.0) for sp in params)
    variant = LOGPROBS if any(sp.logprobs is not None for sp in params) else TOP_K_TOP_P if truncates else RANDOM
    temperature = np.array([0.0 if sp.greedy else sp.temperature for sp in params], np.float32)
    top_k = np.array([sp.top_k if sp.top_k > 0 else NO_TOP_K for sp in params], np.int64)
    top_p = np.array([sp.top_p for sp in params], np.float32)
    return variant, (temperature, top_k, top_p, draws.keys(params, num_generated))
