"""Presence, frequency and repetition penalties, and min_p, as vLLM's sampler applies them.

The runner keeps, per batch row, on the device (vLLM's InputBatch keeps the same for its penalties):

    output_counts[r, t]   how many times the row's output holds token t   [rows, V] int32
    prompt_mask[r, t]     token t is in the row's prompt                  [rows, V] bool

A row is (re)filled from its request's prompt and output tokens when the row is (re)set (new, resumed after
preemption, a prefill chunk); each sampled token is then counted on the device (``count``), so a step reads
them without rebuilding them from lists. Only rows with a penalty are filled or counted.

On the logits of the penalized rows (before temperature; greedy takes the argmax after them):

    repetition  seen = prompt_mask | counts > 0;  logit / p where logit > 0, logit * p elsewhere (seen tokens)
    frequency   logit -= p * counts
    presence    logit -= p * (counts > 0)

min_p, after temperature: tokens whose probability is below min_p x the row's largest are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class Penalties:
    """A step's penalized rows: row index into the logits [P] int64, their counts [P, V] and prompt mask
    [P, V], and their repetition, frequency and presence penalties [P] float32."""

    rows: torch.Tensor
    counts: torch.Tensor
    prompt_mask: torch.Tensor
    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor


def apply_penalties(logits: torch.Tensor, pen: Penalties) -> None:
    """Penalize ``logits`` [N, V] float32 in place (module docstring)."""
    rows = logits[pen.rows]  # [P, V]
    counts = pen.counts.to(rows.dtype)
    output_seen = pen.counts > 0
    rep = pen.repetition.unsqueeze(1)  # [P, 1]
    seen = pen.prompt_mask | output_seen
    scaled = torch.where(rows > 0, rows / rep, rows * rep)
    rows = torch.where(seen, scaled, rows)
    rows = rows - pen.frequency.unsqueeze(1) * counts - pen.presence.unsqueeze(1) * output_seen.to(rows.dtype)
    logits[pen.rows] = rows


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``logits`` [N, V] (after temperature) with tokens below min_p [N] x the row's top probability at -inf."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)  # [N, 1]
    return logits.masked_fill(probs < threshold, float("-inf"))


class PenaltyState:
    """The per-row counts and prompt masks of the runner's batch (module docstring), on ``device``; allocated
    when the first penalized row samples (the vocabulary size is known then) and grown with the rows."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.counts: torch.Tensor | None = None  # [rows, V] int32
        self.prompt_mask: torch.Tensor | None = None  # [rows, V] bool
        self.pending: dict[int, tuple[list[int], list[int]]] = {}  # row -> (prompt, output) to fill it from

    def reset(self, row: int, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Row ``row`` now holds a penalized request with these tokens (filled before its next sample)."""
        self.pending[row] = (list(prompt_ids), list(output_ids))

    def _fit(self, num_rows: int, vocab_size: int) -> None:
        have = 0 if self.counts is None else self.counts.shape[0]
        if num_rows <= have:
            return
        counts = torch.zeros(num_rows, vocab_size, dtype=torch.int32, device=self.device)
        mask = torch.zeros(num_rows, vocab_size, dtype=torch.bool, device=self.device)
        if self.counts is not None:
            counts[:have], mask[:have] = self.counts, self.prompt_mask
        self.counts, self.prompt_mask = counts, mask

    def gather(self, rows: np.ndarray, penalized: np.ndarray, params: list, vocab_size: int) -> Penalties | None:
        """The step's ``Penalties`` of the sampling ``rows`` (the runner's) where ``penalized`` [N] bool (None: none
        is); ``params`` are the rows' SamplingParams."""
        batch_rows = np.flatnonzero(penalized)
        if not len(batch_rows):
            return None
        state_rows, params = rows[batch_rows], [params[i] for i in batch_rows.tolist()]
        self._fit(int(state_rows.max()) + 1, vocab_size)
        for row in state_rows.tolist():
            if row in self.pending:
                self._fill(row, *self.pending.pop(row))
        index = torch.from_numpy(state_rows).to(self.device, non_blocking=True)
        values = torch.tensor([[sp.repetition_penalty, sp.frequency_penalty, sp.presence_penalty] for sp in params],
                              dtype=torch.float32).to(self.device, non_blocking=True)  # [P, 3]
        logit_rows = torch.from_numpy(batch_rows).to(self.device, non_blocking=True)
        return Penalties(logit_rows, self.counts[index], self.prompt_mask[index], values[:, 0], values[:, 1],
                         values[:, 2])

    def _fill(self, row: int, prompt_ids: list[int], output_ids: list[int]) -> None:
        self.counts[row].zero_()
        self.prompt_mask[row].zero_()
        if prompt_ids:
            self.prompt_mask[row, torch.tensor(prompt_ids, dtype=torch.int64).to(self.device)] = True
        if output_ids:
            ids = torch.tensor(output_ids, dtype=torch.int64).to(self.device)
            self.counts[row].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))

    def count(self, rows: np.ndarray, penalized: np.ndarray, tokens: torch.Tensor) -> None:
        """Count the sampled ``tokens`` [N] (on the device) of ``rows`` into the outputs of those ``penalized``."""
        batch_rows = np.flatnonzero(penalized)
        if not len(batch_rows):
            return
        index = torch.from_numpy(rows[batch_rows]).to(self.device, non_blocking=True)
        if len(batch_rows) < len(rows):
            tokens = tokens[torch.from_numpy(batch_rows).to(tokens.device, non_blocking=True)]
        self.counts.index_put_((index, tokens.to(torch.int64)), torch.ones_like(index, dtype=torch.int32),
                               accumulate=True)
