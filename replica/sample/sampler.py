"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeds, min_tokens, logit_bias, and the
logprobs rows ask for (of the raw distribution, gathered by logprobs.py).

All rows are processed together on [N, vocab] tensors. A random row draws by inverse CDF: one
uniform number u per row, token = first index whose cumulative probability exceeds u. So a seeded
row needs one number from its own generator, seeded by (seed, tokens generated so far), and the
order its CDF runs in depends on its own settings only (vocabulary order for plain rows, descending
probability for top-k/top-p rows, whichever code path computed them): a seeded request's tokens do
not depend on what else is in the batch.

Top-k / top-p avoid sorting the vocabulary (a [256, 32000] sort costs ~1 s on one CPU core):
``topk`` picks enough candidates per row (the largest top_k, or TOP_P_CANDIDATES[i] for nucleus
rows); the masks and the draw then run on [N, K]. Rows whose nucleus is wider than the candidates
(very flat distributions) fall back to ``apply_top_k_top_p``'s full sort.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from kvmesh.replica.sample.logprobs import LogprobsTensors, gather_logprobs
from kvmesh.replica.serving.sampling_params import SEED_MIX, SamplingParams
from kvmesh.replica.worker.cpu_gpu_buffer import HostCopies, PackedUpload

_MIX_A, _MIX_B, _MASK = SEED_MIX
TOP_P_CANDIDATES = (256, 4096)  # candidates per nucleus row tried in turn before a full sort


@dataclass(slots=True)
class SamplingMetadata:
    """Per-row sampling settings as device tensors (row i = the i-th sampling request), plus the host facts
    that decide which code runs (so sampling never reads a device value back to branch on it)."""

    temperature: torch.Tensor | None
    """[N] float32 (1.0 on greedy rows); None when every row is greedy."""
    greedy_rows: torch.Tensor | None
    """[N] bool: rows that take the argmax; None when every row is greedy."""
    top_k: torch.Tensor | None
    """[N] int64, vocab_size where disabled; None when no row uses top-k."""
    top_p: torch.Tensor | None
    """[N] float32, 1.0 where disabled; None when no row uses top-p."""
    seeded: torch.Tensor | None
    """[2, S] int64: seeded random rows and their draw keys (``seed_key``) this step; None when none."""
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
    """Largest top-k of the truncated rows (vocab_size when one of them has none)."""
    logprobs_index: torch.Tensor | None = None
    """[M] int64 ``logprobs_rows`` on the device (None with them)."""

    @property
    def all_greedy(self) -> bool:
        return self.temperature is None

    @property
    def plain_greedy(self) -> bool:
        """Every row takes the argmax of its logits as they are (no bias, bans or logprobs)."""
        return self.temperature is None and self.banned is None and self.logit_bias is None \
            and self.max_num_logprobs is None


def seed_key(seed: int, num_generated: int) -> int:
    """The key a seeded request's next token is drawn with: ``(seed*A + n*B + 1) & MASK`` (SEED_MIX), so its
    tokens depend only on the seed and their position (and a continuation's moved seed gives the same key)."""
    return (seed * _MIX_A + num_generated * _MIX_B + 1) & _MASK


_SPLITMIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def seeded_uniforms(keys: torch.Tensor) -> torch.Tensor:
    """keys [S] int64 -> [S] float32 uniforms in [0, 1), on the keys' device: splitmix64 of each key (int64
    arithmetic wraps modulo 2^64 like uint64), its top 24 bits. A counter-based draw: no generator per row,
    nothing read back, the same numbers on every device."""
    golden, mul1, mul2 = (_signed(c) for c in _SPLITMIX)
    z = keys + golden
    z = (z ^ _shr(z, 30)) * mul1
    z = (z ^ _shr(z, 27)) * mul2
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) * (1.0 / (1 << 24))


def build_sampling_metadata(params: Sequence[SamplingParams], num_generated: Sequence[int], vocab_size: int,
                            eos_token_ids: Sequence[int], device: torch.device,
                            packer: PackedUpload | None = None) -> SamplingMetadata:
    """Collect the sampling rows' parameters into tensors: one Python pass over the rows, then one
    non-blocking upload of them all (through ``packer``, the runner's staging buffer; a fresh one
    without); ``num_generated[i]`` = tokens row i has generated so far (min_tokens, seeded rows)."""
    i64, f32 = np.int64, np.float32
    arrays: dict[str, tuple] = {}  # name -> (host array, dtype), uploaded together
    banned_rows, banned_ids = [], []
    for row, (n, sp) in enumerate(zip(num_generated, params, strict=True)):
        if sp.min_tokens and n < sp.min_tokens:
            ids = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(eos_token_ids))
            banned_rows += [row] * len(ids)
            banned_ids += ids
    if banned_ids:
        arrays["banned"] = (np.array([banned_rows, banned_ids]), i64)  # [2, B]
    bias_rows, bias_ids, bias_values = [], [], []
    for row, sp in enumerate(params):
        if sp.logit_bias:
            bias_rows += [row] * len(sp.logit_bias)
            bias_ids += list(sp.logit_bias)
            bias_values += [float(v) for v in sp.logit_bias.values()]
    if bias_ids:
        arrays["bias_at"], arrays["bias"] = (np.array([bias_rows, bias_ids]), i64), (np.array(bias_values), f32)
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
        arrays["temperature"] = ([1.0 if sp.greedy else sp.temperature for sp in params], f32)
        arrays["greedy_rows"] = ([sp.greedy for sp in params], np.bool_)
        if any(k < vocab_size for k in top_ks):
            arrays["top_k"] = (top_ks, i64)
        if any(sp.top_p < 1.0 for sp in params):
            arrays["top_p"] = ([sp.top_p for sp in params], f32)
        seeded = [(row, seed_key(sp.seed, n)) for row, (n, sp) in enumerate(zip(num_generated, params, strict=True))
                  if sp.seed is not None and not sp.greedy]
        if seeded:
            arrays["seeded"] = (np.array(seeded).T, i64)  # [2, S]
        plain = [row for row, sp in enumerate(params) if not sp.greedy and not truncated[row]]
        if plain:
            arrays["plain_rows"] = (plain, i64)
        if trunc:
            arrays["truncated_rows"] = (trunc, i64)
    packer = packer or PackedUpload(0, device)
    t = dict(zip(arrays, packer.upload(list(arrays.values())), strict=True)) if arrays else {}
    banned = (t["banned"][0], t["banned"][1]) if "banned" in t else None
    bias = (t["bias_at"][0], t["bias_at"][1], t["bias"]) if "bias" in t else None
    if greedy:
        return SamplingMetadata(None, None, None, None, None, banned, bias, max_num_logprobs, logprobs_rows,
                                logprobs_index=t.get("logprobs_index"))
    return SamplingMetadata(
        t["temperature"], t["greedy_rows"], t.get("top_k"), t.get("top_p"), t.get("seeded"), banned, bias,
        max_num_logprobs, logprobs_rows, any_greedy=any(sp.greedy for sp in params),
        plain_rows=t.get("plain_rows"), truncated_rows=t.get("truncated_rows"),
        max_top_k=max((top_ks[row] for row in trunc), default=0), logprobs_index=t.get("logprobs_index"))


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


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax; on CPU through numpy, ~20x faster than torch's CPU argmax kernel."""
    if logits.device.type == "cpu":
        return torch.from_numpy(np.argmax(logits.numpy(), axis=-1))
    return logits.argmax(dim=-1)


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [N, K] (need not be normalized), u [N] uniform in [0, 1) -> indices [N]."""
    cdf = probs.cumsum(dim=-1)  # [N, K]
    target = (u * cdf[:, -1]).unsqueeze(1)  # [N, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def _truncated_candidates(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                          num_candidates: int, num: int | None = None):
    """(probs [N, K], indices [N, K]) of each row's top-k / nucleus set, or None when K would be the
    whole vocabulary or a nucleus does not fit in the candidates (then the caller sorts). ``num``: K when
    the host knows it (the largest top-k), else it is read from the device."""
    vocab = logits.shape[-1]
    n = logits.shape[0]
    k_eff = k if k is not None else torch.full((n,), vocab, dtype=torch.long, device=logits.device)
    if p is not None:  # nucleus rows without top-k start from TOP_P_CANDIDATES candidates
        k_eff = torch.where((p < 1.0) & (k_eff >= vocab), min(num_candidates, vocab), k_eff)
    num = int(k_eff.max()) if num is None else num
    if num >= vocab:
        return None
    values, indices = logits.topk(num, dim=-1)  # [N, K], descending
    pos = torch.arange(num, device=logits.device)
    values = values.masked_fill(pos[None, :] >= k_eff[:, None], float("-inf"))  # top-k
    if p is not None:
        has_k = k is not None and (k < vocab)
        full_lse = logits.logsumexp(dim=-1)
        lse = torch.where(has_k, values.logsumexp(dim=-1), full_lse) if k is not None else full_lse
        probs = (values - lse[:, None]).exp()
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely candidates
        covered = (before[:, -1] + probs[:, -1]) >= p  # the nucleus ends inside the candidates
        limited = k_eff < num if k is None else (k < vocab)
        if not bool((covered | limited | (p >= 1.0)).all()):
            return None
        keep = (before < p[:, None]) | (pos[None, :] == 0)
        values = values.masked_fill(~keep, float("-inf"))
    return torch.softmax(values, dim=-1), indices


def _sample_truncated(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                      u: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Draw from each row's top-k / nucleus set by inverse CDF over descending probability.

    On the CPU nucleus rows first try TOP_P_CANDIDATES candidates (a full sort is slow there). On a device
    the path is chosen from host facts only -- top-k rows take their ``max_top_k`` candidates, nucleus rows
    sort -- because whether a nucleus fits the candidates is a device value the host would wait for."""
    on_cpu = logits.device.type == "cpu"
    tries = (0,) if p is None else TOP_P_CANDIDATES if on_cpu else ()
    for num_candidates in tries:
        candidates = _truncated_candidates(logits, k, p, num_candidates, None if on_cpu else max_top_k)
        if candidates is not None:
            probs, indices = candidates  # [N, K], most likely first
            return indices.gather(1, sample_from_probs(probs, u).unsqueeze(1)).squeeze(1)
    probs, order = torch.softmax(apply_top_k_top_p(logits, k, p), dim=-1).sort(dim=-1, descending=True)
    return order.gather(1, sample_from_probs(probs, u).unsqueeze(1)).squeeze(1)


class Sampler:
    """logits [N, V] + SamplingMetadata -> token ids [N] (on the logits' device; nothing read back)."""

    def __init__(self, generator: torch.Generator | None = None, logprobs_copies: HostCopies | None = None) -> None:
        self.generator = generator  # uniforms for unseeded random rows
        self.logprobs_copies = logprobs_copies  # where packed logprobs come back without blocking (None: blocking)

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        logits = logits.to(torch.float32, copy=md.banned is not None or md.logit_bias is not None)
        if md.logit_bias is not None:
            rows, token_ids, biases = md.logit_bias
            logits.index_put_((rows, token_ids), biases, accumulate=True)
        if md.banned is not None:
            logits.index_put_(md.banned, logits.new_full((), float("-inf")))
        if md.all_greedy:
            return argmax(logits)
        greedy = argmax(logits) if md.any_greedy else None
        logits = logits / md.temperature.unsqueeze(1)
        u = torch.rand(logits.shape[0], generator=self.generator, device=logits.device)
        if md.seeded is not None:  # seeded rows draw from their keys: one index_put, no per-row generator
            u.index_put_((md.seeded[0],), seeded_uniforms(md.seeded[1]))
        # each row's draw depends on its own settings only: plain rows in vocabulary order, top-k/top-p rows
        # in descending probability (so which other rows share the batch never changes a seeded row's token)
        sampled = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        if md.plain_rows is not None:
            rows = md.plain_rows
            sampled[rows] = sample_from_probs(torch.softmax(logits[rows], dim=-1), u[rows])
        if md.truncated_rows is not None:
            rows = md.truncated_rows
            k = md.top_k[rows] if md.top_k is not None else None
            p = md.top_p[rows] if md.top_p is not None else None
            sampled[rows] = _sample_truncated(logits[rows], k, p, u[rows], md.max_top_k)
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
