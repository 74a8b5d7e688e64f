"""Batched sampling: greedy, temperature, top-k, top-p, min_p, penalties (penalties.py), per-request seeds,
min_tokens, logit_bias, and the logprobs rows ask for (of the raw distribution, gathered by logprobs.py).

All rows are processed together on [N, vocab] tensors. A random row draws by inverse CDF with one
uniform number per row from its key (draws.py: splitmix64 of (seed, position), or of the runner's
count of unseeded draws), over weights whose order depends on its own settings only (vocabulary order
for plain rows, descending probability for top-k/top-p rows): fixed_sampler.py defines the draw, and
the decode CUDA graph runs the same draw, so both give the same tokens, whatever shares the batch.

This eager sampler is what runs outside the decode graphs: logit_bias, allowed_token_ids and min_tokens bans
(applied to the logits first; their tensors are kept across steps: token_lists.py), the steps that are not
decode-only, every step without graphs. Top-k / top-p avoid sorting the vocabulary on the CPU (a [256, 32000]
sort costs ~1 s on one CPU core): ``topk`` picks a shortlist per row (the largest top_k, or TOP_P_CANDIDATES[i]
for nucleus rows without one) and the draw runs on [N, K]; rows whose nucleus is wider than the shortlist (very
flat distributions) take the full sort.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from kvmesh.replica.sample.draws import RandomDraws, seeded_uniforms
from kvmesh.replica.sample.fixed_sampler import draw_in_order, truncated_weights
from kvmesh.replica.sample.grammar_mask import apply_grammar_bitmask
from kvmesh.replica.sample.logprobs import LogprobsTensors, gather_logprobs
from kvmesh.replica.sample.penalties import Penalties, apply_min_p, apply_penalties
from kvmesh.replica.sample.token_lists import BatchTokenLists, StepTokenLists
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.utils.cpu_gpu_buffer import HostCopies, PackedUpload

TOP_P_CANDIDATES = (256, 4096)  # shortlist per nucleus row tried in turn before a full sort (CPU)


@dataclass(slots=True)
class SamplingMetadata:
    """Per-row sampling settings as device tensors (row i = the i-th sampling request), plus the host facts
    that decide which code runs (so sampling never reads a device value back to branch on it)."""

    temperature: torch.Tensor | None
    """[N] float32 (1.0 on greedy rows); None when every row is greedy."""
    greedy_rows: torch.Tensor | None
    """[N] bool: rows that take the argmax; None when every row is greedy."""
    top_k: torch.Tensor | None
    """[N] int64, vocab_size where disabled; None when no row uses top-k or top-p."""
    top_p: torch.Tensor | None
    """[N] float32, 1.0 where disabled; None when no row uses top-k or top-p."""
    keys: torch.Tensor | None
    """[N] int64 draw keys of the rows this step (draws.py; 0 on greedy rows); None when every row is greedy."""
    banned: tuple[torch.Tensor, torch.Tensor] | None = None
    """(rows [B], token ids [B]) int64 that must not be sampled yet (stop/EOS tokens before min_tokens)."""
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """(rows [B], token ids [B], biases [B] float32) added to the logits before sampling (OpenAI ``logit_bias``)."""
    max_num_logprobs: int | None = None
    """Largest ``logprobs`` of any row; None when no row asks for logprobs."""
    logprobs_rows: list[int] | None = None
    """The rows that ask for logprobs; None when all do (or none: see ``max_num_logprobs``)."""
    any_greedy: bool = False
    """Some (not all) rows are greedy."""
    plain_rows: torch.Tensor | None = None
    """[P] int64 random rows without top-k/top-p (None: none)."""
    truncated_rows: torch.Tensor | None = None
    """[Q] int64 random rows with top-k and/or top-p (None: none)."""
    max_top_k: int = 0
    """Largest top-k below the vocabulary size of the truncated rows (0: none has one)."""
    nucleus_only: bool = False
    """Some truncated row has top-p and no top-k (its shortlist is a guess: TOP_P_CANDIDATES)."""
    logprobs_index: torch.Tensor | None = None
    """[M] int64 ``logprobs_rows`` on the device (None with them)."""
    allowed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """(rows [R] int64 that allow only some tokens, then (rows [A], token ids [A]) int64 of the allowed ones):
    every other token of those rows is -inf (vLLM's ``allowed_token_ids``)."""
    penalties: Penalties | None = None
    """The penalized rows with their device counts and prompt masks (penalties.py); None: no row is penalized."""
    min_p: torch.Tensor | None = None
    """[N] float32 (0: none); None when no random row uses min_p."""
    grammar: tuple[list[int], torch.Tensor] | None = None
    """(rows, bitmask [N, ceil(V / 32)] int32) of structured-output rows: tokens their grammar does not
    allow next are -inf before anything else (grammar_mask.py); None: no such row."""

    @property
    def all_greedy(self) -> bool:
        return self.temperature is None

    @property
    def plain_greedy(self) -> bool:
        """Every row takes the argmax of its logits as they are (no bias, bans or logprobs)."""
        return self.temperature is None and self.banned is None and self.logit_bias is None \
            and self.allowed is None and self.max_num_logprobs is None and self.penalties is None \
            and self.grammar is None


def build_sampling_metadata(params: Sequence[SamplingParams], num_generated: Sequence[int], vocab_size: int,
                            eos_token_ids: Sequence[int], device: torch.device,
                            packer: PackedUpload | None = None, draws: RandomDraws | None = None,
                            lists: StepTokenLists | None = None) -> SamplingMetadata:
    """Collect the sampling rows' parameters into tensors: one Python pass over the rows, then one
    non-blocking upload of them all (through ``packer``, the runner's staging buffer; a fresh one
    without); ``num_generated[i]`` = tokens row i has generated so far (min_tokens, seeded rows);
    ``draws``: the runner's count of unseeded draws (a fresh one without); ``lists``: the step's token-list
    tensors, kept by the runner's batch across steps (token_lists.py; made from ``params`` without)."""
    i64 = np.int64
    arrays: dict[str, tuple] = {}  # name -> (host array, dtype), uploaded together
    if lists is None:
        lists = BatchTokenLists.of(params, device).step(np.arange(len(params)), np.asarray(num_generated, i64),
                                                        eos_token_ids)
    banned, bias, allowed = lists
    asked = [row for row, sp in enumerate(params) if sp.logprobs is not None]
    max_num_logprobs = max(params[row].logprobs for row in asked) if asked else None
    logprobs_rows = asked if 0 < len(asked) < len(params) else None
    if logprobs_rows is not None:
        arrays["logprobs_index"] = (logprobs_rows, i64)
    greedy = all(sp.greedy for sp in params)
    top_ks = [sp.top_k if 0 < sp.top_k < vocab_size else vocab_size for sp in params]
    truncated = [not sp.greedy and (k < vocab_size or sp.top_p < 1.0) for k, sp in zip(top_ks, params, strict=True)]
    trunc = [row for row, t in enumerate(truncated) if t]
    if not greedy:
        _add_random_sampling(arrays, params, num_generated, top_ks, truncated, trunc, draws)
    packer = packer or PackedUpload(0, device)
    t = dict(zip(arrays, packer.upload(list(arrays.values())), strict=True)) if arrays else {}
    if greedy:
        return SamplingMetadata(None, None, None, None, None, banned, bias, max_num_logprobs, logprobs_rows,
                                logprobs_index=t.get("logprobs_index"), allowed=allowed)
    return SamplingMetadata(
        t["temperature"], t["greedy_rows"], t.get("top_k"), t.get("top_p"), t["keys"], banned, bias,
        max_num_logprobs, logprobs_rows, any_greedy=any(sp.greedy for sp in params),
        plain_rows=t.get("plain_rows"), truncated_rows=t.get("truncated_rows"),
        max_top_k=max((top_ks[row] for row in trunc if top_ks[row] < vocab_size), default=0),
        nucleus_only=any(top_ks[row] >= vocab_size for row in trunc), logprobs_index=t.get("logprobs_index"),
        allowed=allowed, min_p=t.get("min_p"))


def _add_random_sampling(arrays: dict[str, tuple], params: Sequence[SamplingParams], num_generated: Sequence[int],
                         top_ks: list[int], truncated: list[bool], trunc: list[int],
                         draws: RandomDraws | None) -> None:
    """The arrays of a batch that draws: temperatures, which rows are greedy, the draws' keys, top-k / top-p
    for the ``truncated`` rows, min-p when a row sets it, and the rows that draw from the whole distribution."""
    i64, f32 = np.int64, np.float32
    arrays["temperature"] = ([1.0 if sp.greedy else sp.temperature for sp in params], f32)
    arrays["greedy_rows"] = ([sp.greedy for sp in params], np.bool_)
    if trunc:
        arrays["top_k"] = (top_ks, i64)
        arrays["top_p"] = ([sp.top_p for sp in params], f32)
    arrays["keys"] = ((draws or RandomDraws()).keys(params, num_generated), i64)
    if any(sp.min_p > 0.0 and not sp.greedy for sp in params):
        arrays["min_p"] = ([sp.min_p for sp in params], f32)
    plain = [row for row, sp in enumerate(params) if not sp.greedy and not truncated[row]]
    if plain:
        arrays["plain_rows"] = (plain, i64)
    if trunc:
        arrays["truncated_rows"] = (trunc, i64)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Set logits outside each row's top-k / nucleus to -inf (logits [N, V], k [N], p [N]): the plain-torch
    reference of which tokens a row may draw (tests hold the draws to it)."""
    if k is None and p is None:
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)  # ascending
    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.shape[1] - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    if p is not None:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        top_p_mask = probs_sum <= 1 - p.unsqueeze(1)  # the low tail whose mass stays outside top_p
        top_p_mask[:, -1] = False  # always keep the most likely token
        logits_sort.masked_fill_(top_p_mask, float("-inf"))
    return logits.scatter(-1, logits_idx, logits_sort)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax; on CPU through numpy, ~20x faster than torch's CPU argmax kernel."""
    if logits.device.type == "cpu":
        return torch.from_numpy(np.argmax(logits.numpy(), axis=-1))
    return logits.argmax(dim=-1)


def _sample_truncated(probs: torch.Tensor, k: torch.Tensor, p: torch.Tensor, u: torch.Tensor,
                      md: SamplingMetadata) -> torch.Tensor:
    """Draw from each row's top-k / nucleus set (probs [Q, V], k [Q], p [Q], u [Q]) as fixed_sampler.py does.

    The shortlist is sized from host facts: the largest top-k when every row has one; else, on the CPU,
    TOP_P_CANDIDATES in turn while a nucleus ends past the shortlist (read back: the CPU has no device to
    wait for); on a device the full sort, as the graph does."""
    vocab = probs.shape[-1]
    tries = (md.max_top_k,) if not md.nucleus_only else \
        tuple(max(c, md.max_top_k) for c in TOP_P_CANDIDATES) if probs.device.type == "cpu" else ()
    for num in tries:
        if num >= vocab:
            break
        values, indices = probs.topk(num, dim=-1)  # [Q, K], most likely first
        weights, covered = truncated_weights(values, k, p, vocab)
        if not md.nucleus_only or bool(covered.all()):
            return indices.gather(1, draw_in_order(weights, u).unsqueeze(1)).squeeze(1)
    values, order = probs.sort(dim=-1, descending=True)  # [Q, V]
    weights, _ = truncated_weights(values, k, p, vocab)
    return order.gather(1, draw_in_order(weights, u).unsqueeze(1)).squeeze(1)


class Sampler:
    """logits [N, V] + SamplingMetadata -> token ids [N] (on the logits' device; nothing read back)."""

    def __init__(self, logprobs_copies: HostCopies | None = None) -> None:
        # random rows draw from their keys (draws.py): no generator state
        self.logprobs_copies = logprobs_copies  # where packed logprobs come back without blocking (None: blocking)

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        logits = logits.to(torch.float32, copy=not (md.banned is None and md.logit_bias is None and md.allowed is None
                                                    and md.penalties is None and md.grammar is None))
        if md.grammar is not None:
            apply_grammar_bitmask(logits, *md.grammar)
        if md.logit_bias is not None:
            rows, token_ids, biases = md.logit_bias
            logits.index_put_((rows, token_ids), biases, accumulate=True)
        if md.allowed is not None:
            allowing, rows, token_ids = md.allowed
            kept = logits[rows, token_ids]  # [A]
            logits[allowing] = float("-inf")
            logits.index_put_((rows, token_ids), kept)
        if md.banned is not None:
            logits.index_put_(md.banned, logits.new_full((), float("-inf")))
        if md.penalties is not None:
            apply_penalties(logits, md.penalties)
        if md.all_greedy:
            return argmax(logits)
        greedy = argmax(logits) if md.any_greedy else None
        logits = logits / md.temperature.unsqueeze(1)
        if md.min_p is not None:
            logits = apply_min_p(logits, md.min_p)
        u = seeded_uniforms(md.keys)  # [N]
        # each row's draw depends on its own logits, settings and key (fixed_sampler.py): the same token as the
        # decode graph's sampler, whichever rows share the batch
        sampled = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        if md.plain_rows is not None:
            rows = md.plain_rows
            sampled[rows] = draw_in_order(torch.softmax(logits[rows], dim=-1), u[rows])
        if md.truncated_rows is not None:
            rows = md.truncated_rows
            probs = torch.softmax(logits[rows], dim=-1)  # [Q, V]
            sampled[rows] = _sample_truncated(probs, md.top_k[rows], md.top_p[rows], u[rows], md)
        return sampled if greedy is None else torch.where(md.greedy_rows, greedy, sampled)

    def sample_with_logprobs(self, logits: torch.Tensor, md: SamplingMetadata
                             ) -> tuple[torch.Tensor, LogprobsTensors | None]:
        """Sample as ``__call__`` does, plus the logprobs the rows asked for, of the *raw* distribution
        (log_softmax of the logits before logit_bias, bans, temperature, top-k/top-p: vLLM's default
        ``logprobs_mode="raw_logprobs"``). Rows that did not ask get none (``md.logprobs_rows``)."""
        if md.max_num_logprobs is None:
            return self(logits, md), None
        rows, index = md.logprobs_rows, md.logprobs_index  # [M] on the device, uploaded with the settings
        raw = (logits if index is None else logits[index]).to(torch.float32)  # [M, V]
        lse = raw.logsumexp(dim=-1, keepdim=True)  # [M, 1]; the full log_softmax is never built
        sampled = self(logits, md)  # [N]
        chosen = sampled if index is None else sampled[index]
        return sampled, gather_logprobs(raw, md.max_num_logprobs, chosen, lse, rows, self.logprobs_copies)
