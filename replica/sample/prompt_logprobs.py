"""Prompt logprobs: the log-probability of every prompt token given the tokens before it.

The hidden state at position p predicts the token at p + 1, so a prefill chunk computing positions
[s, e) of a prompt of P tokens yields the logprobs of prompt tokens s+1 .. e-1 from its own rows, and:

    chunk ends inside the prompt (e < P): its last row predicts token e, the first of the next chunk;
        that row's log-probabilities wait here until the next chunk names the token.
    chunk ends the prompt (e == P): its last row predicts the first *generated* token (the sampler's).

    prompt:  p0   p1   p2   p3 | p4   p5          chunks [0, 4) and [4, 6), P = 6
    rows:    h0   h1   h2   h3 | h4   h5
    targets: p1   p2   p3  (p4)| p5  (sampled)    (p4): h3's row waits for chunk 2's first token
             position 0 has no logprobs (None), as in vLLM.

Only requests that have generated nothing yet get prompt logprobs: a request preempted after its first
token recomputes its prompt but already has them. A request asking for them never reads the prefix
cache (``Request.skip_reading_prefix_cache``), so every prompt position is computed here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from kvmesh.replica.engine.outputs import TokenLogprobs
from kvmesh.replica.engine.scheduler_output import ScheduledRequest
from kvmesh.replica.sample.logprobs import gather_logprobs
from kvmesh.replica.worker.cpu_gpu_buffer import to_device

ROWS_PER_PASS = 1024
"""Prompt positions whose logits are computed at once (bounds the [rows, vocab] fp32 temporaries)."""


class PromptLogprobsProcessor:
    """Lives in the model runner; keeps the one pending row of each request between its prefill chunks."""

    def __init__(self) -> None:
        # request_id -> (target position, [1, V] logits of the row predicting it, [1, 1] their logsumexp)
        self.pending: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}

    def free(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self.pending.pop(request_id, None)

    def compute(self, requests: Sequence[ScheduledRequest], first_rows: Mapping[str, int], hidden: torch.Tensor,
                compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, list[tuple[int, TokenLogprobs]]]:
        """Prompt logprobs of this step's chunks of ``requests``; ``hidden`` [T, H], where request r's chunk
        occupies the rows from ``first_rows[r.request_id]`` on."""
        out: dict[str, list[tuple[int, TokenLogprobs]]] = {}
        for r in requests:
            k = r.sampling_params.prompt_logprobs
            if k is None or r.output_token_ids:
                continue
            start, num = r.num_computed_tokens, len(r.token_ids)
            entries = out[r.request_id] = []
            pending = self.pending.pop(r.request_id, None)
            if pending is not None and pending[0] == start:  # the previous chunk's last row predicts token_ids[0]
                target = to_device([r.token_ids[0]], torch.int64, hidden.device)
                entries.append((start, gather_logprobs(pending[1], k, target, pending[2]).row(0, k)))
            num_rows = num - 1 if r.sample else num  # rows whose target is a prompt token (or the next chunk's)
            first_row = first_rows[r.request_id]
            for lo in range(0, num_rows, ROWS_PER_PASS):
                hi = min(num_rows, lo + ROWS_PER_PASS)
                logits = compute_logits(hidden[first_row + lo: first_row + hi]).to(torch.float32)  # [hi-lo, V]
                lse = logits.logsumexp(dim=-1, keepdim=True)  # [hi-lo, 1]
                known = min(hi, num - 1) - lo  # rows whose target lies in this chunk
                if known > 0:
                    targets = to_device(r.token_ids[lo + 1: lo + 1 + known], torch.int64, hidden.device)
                    lp = gather_logprobs(logits[:known], k, targets, lse[:known])
                    entries.extend((start + lo + 1 + j, lp.row(j, k)) for j in range(known))
                if hi == num:  # the chunk's last row: its target comes with the next chunk
                    self.pending[r.request_id] = (start + num, logits[-1:].clone(), lse[-1:].clone())
        return out
