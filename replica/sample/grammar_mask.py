"""Structured outputs' token bitmask applied to the logits (vLLM's ``apply_grammar_bitmask``), eagerly on the logits'
device, never inside a graph: xgrammar's own kernel on CPU and CUDA (C++ / CUDA: the constrained rows' logits
only), plain torch anywhere else (the ``meta`` device of the tests; the same result, slower).

    bitmask [N, W] int32, W = ceil(V / 32): bit j of word w set = token 32 w + j allowed (xgrammar's layout),
            one row per sampling row of the logits (rows not constrained: all ones, never read)
    rows    the G constrained rows
    logits[r, t] = -inf for r in rows wherever token t is not allowed in bitmask row r
"""

from __future__ import annotations

import numpy as np
import torch
from kvmesh.replica.step.scheduler_output import GrammarBitmask

KERNEL_DEVICES = ("cpu", "cuda")
"""Where xgrammar's kernel masks the logits; elsewhere the plain torch unpacking does."""


def grammar_rows(grammar: GrammarBitmask, sample_request_ids: list[str], device: torch.device
                 ) -> tuple[list[int], torch.Tensor] | None:
    """(rows, bitmask [N, W] on ``device``) for the constrained requests among a step's N sampling rows (in
    ``sample_request_ids`` order); None when none of them samples here."""
    position = {rid: i for i, rid in enumerate(sample_request_ids)}
    pairs = [(position[rid], g) for g, rid in enumerate(grammar.request_ids) if rid in position]
    if not pairs:
        return None
    rows, picked = zip(*pairs, strict=True)
    bitmask = np.full((len(sample_request_ids), grammar.bitmask.shape[1]), -1, np.int32)  # [N, W]
    bitmask[list(rows)] = grammar.bitmask[list(picked)]
    return list(rows), torch.from_numpy(bitmask).to(device, non_blocking=True)


def apply_grammar_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, every token of ``logits`` [N, V] rows ``rows`` that ``bitmask`` [N, W] forbids."""
    if logits.device.type in KERNEL_DEVICES and logits.dtype == torch.float32:
        import xgrammar

        xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=rows)
    else:
        apply_grammar_bitmask_torch(logits, rows, bitmask)


def apply_grammar_bitmask_torch(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """``apply_grammar_bitmask`` in plain torch ops (any device)."""
    vocab = logits.shape[-1]
    index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)  # [G]
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    allowed = ((bitmask[index].unsqueeze(-1) >> bits) & 1).to(torch.bool).flatten(1)  # [G, 32 W]
    if allowed.shape[1] < vocab:  # logits wider than the tokenizer's words: the padding is never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    logits[index] = logits[index].masked_fill(~allowed[:, :vocab], float("-inf"))
