"""The runner's side of speculative decoding: the target's argmax at every draft position of a step.

A request with drafts runs as one chunk ``[last token, d0, ..., d(K-1)]``; the hidden state at chunk index j
predicts the token after input j, so indices 0..K-1 give the targets that d0..d(K-1) are checked against
(drafting.py accepts them), and index K is sampled as usual (the bonus token when every draft is accepted).
``SpecVerifier`` holds the runner's generator of the rejection draws of unseeded requests (seeded from the engine's
seed); a seeded request draws from keys of its own seed and positions (rejection.py), whatever shares its batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from kvmesh.replica.spec_decode.rejection import rejection_targets, verify_uniforms
from kvmesh.replica.step.scheduler_output import SchedulerOutput

FirstIndex = Callable[[list[str]], dict[str, int]]
"""Request ids -> the index of each one's first token among the step's (the runner's input batch knows)."""


def draft_targets(out: SchedulerOutput, first_index: FirstIndex, hidden: torch.Tensor,
                  compute_logits: Callable[[torch.Tensor], torch.Tensor], generator: torch.Generator
                  ) -> dict[str, list[int]] | None:
    """request_id -> the target's token at each of its draft positions (``hidden`` [T, H], the step's): the
    argmax for a greedy request, else the draft where rejection sampling accepts it (rejection.py, against the
    draft model's q rows when it sent them); None when the step has no drafts."""
    srs = [sr for sr in out.scheduled if sr.spec_token_ids]
    if not srs:
        return None
    starts = first_index([sr.request_id for sr in srs])
    index = [starts[sr.request_id] + j for sr in srs for j in range(len(sr.spec_token_ids))]
    logits = compute_logits(hidden[torch.tensor(index, device=hidden.device)])  # [sum K, V]
    ids = logits.argmax(dim=-1).tolist()
    targets, at = {}, 0
    for sr in srs:
        num, sp = len(sr.spec_token_ids), sr.sampling_params
        if sp.greedy:
            targets[sr.request_id] = ids[at:at + num]
        else:
            uniforms = verify_uniforms(sp, len(sr.output_token_ids), num, generator, logits.device)
            targets[sr.request_id] = rejection_targets(logits[at:at + num], sr.spec_token_ids, sp, uniforms,
                                                       sr.draft_probs)
        at += num
    return targets


class SpecVerifier:
    """The runner's draft verification: its generator, created on the first step with drafts."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.generator: torch.Generator | None = None

    def __call__(self, out: SchedulerOutput, first_index: FirstIndex, hidden: torch.Tensor,
                 compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, list[int]] | None:
        if self.generator is None:
            self.generator = torch.Generator(hidden.device).manual_seed(self.seed)
        return draft_targets(out, first_index, hidden, compute_logits, self.generator)
