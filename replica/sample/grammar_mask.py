"""Structured outputs' token bitmask applied to the logits (vLLM's ``apply_grammar_bitmask``), in plain torch on
the logits' device, so it runs wherever the eager sampler does (CPU, CUDA, ``meta``) and never inside a graph.

    bitmask [G, W] int32, W = ceil(V / 32): bit j of word w set = token 32 w + j allowed (xgrammar's layout)
    rows    [G] int64: which sampling row of the logits each bitmask row is
    logits[rows[g], t] = -inf wherever token t is not allowed in bitmask row g
"""

from __future__ import annotations

import numpy as np
import torch
from kvmesh.replica.step.scheduler_output import GrammarBitmask


def grammar_rows(grammar: GrammarBitmask, sample_request_ids: list[str], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows [G], bitmask [G, W]) on ``device`` for the constrained requests among a step's sampling rows (in
    ``sample_request_ids`` order); None when none of them samples here."""
    position = {rid: i for i, rid in enumerate(sample_request_ids)}
    pairs = [(position[rid], g) for g, rid in enumerate(grammar.request_ids) if rid in position]
    if not pairs:
        return None
    rows, picked = zip(*pairs, strict=True)
    bitmask = grammar.bitmask if len(picked) == len(grammar.request_ids) else grammar.bitmask[list(picked)]
    return (torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
            torch.from_numpy(np.ascontiguousarray(bitmask)).to(device, non_blocking=True))


def apply_grammar_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, every token of ``logits`` [N, V] rows ``rows`` [G] that ``bitmask`` [G, W] forbids."""
    vocab = logits.shape[-1]
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).to(torch.bool).flatten(1)  # [G, 32 W]
    if allowed.shape[1] < vocab:  # logits wider than the tokenizer's words: the padding is never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    logits[rows] = logits[rows].masked_fill(~allowed[:, :vocab], float("-inf"))
