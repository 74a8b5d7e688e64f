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

Nothing waits in the launch: every pass of a step is packed on the device at the step's widest
``prompt_logprobs`` (each entry is cut to its request's own), the packs go to the host in one
non-blocking copy into pinned buffers (``HostCopies``, allocated on first use), and the entries are
read when the step's output is (``PendingPromptLogprobs.resolve``, from ``AsyncModelRunnerOutput.get``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from kvmesh.replica.sample.logprobs import LogprobsTensors, pack_logprobs, to_host
from kvmesh.replica.serving.sampling_params import MAX_LOGPROBS
from kvmesh.replica.step.outputs import TokenLogprobs
from kvmesh.replica.step.scheduler_output import ScheduledRequest
from kvmesh.replica.utils.cpu_gpu_buffer import HostCopies, to_device

ROWS_PER_PASS = 1024
"""Prompt positions whose logits are computed at once (bounds the [rows, vocab] fp32 temporaries)."""


class PendingPromptLogprobs:
    """A step's prompt logprobs on their way to the host: ``resolve()`` waits for the copy and reads them."""

    def __init__(self, request_ids: list[str], entries: list[tuple[str, int, int]],
                 packed: LogprobsTensors | None) -> None:
        self.request_ids, self.entries, self.packed = request_ids, entries, packed  # entries: (request, position, k)

    def resolve(self) -> dict[str, list[tuple[int, TokenLogprobs]]]:
        """request_id -> [(prompt position, its logprobs)] for every request that asked (maybe no entries)."""
        out: dict[str, list[tuple[int, TokenLogprobs]]] = {rid: [] for rid in self.request_ids}
        for row, (rid, position, k) in enumerate(self.entries):
            out[rid].append((position, self.packed.row(row, k)))
        return out


class PromptLogprobsProcessor:
    """Lives in the model runner; keeps the one pending row of each request between its prefill chunks."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        # request_id -> (target position, [1, V] logits of the row predicting it, [1, 1] their logsumexp)
        self.pending: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}
        self.max_rows, self.device = max_rows, device  # a step's entries at most (its tokens + pending rows)
        self.copies: HostCopies | None = None  # [depth, max_rows * widest entry] pinned, made on first use

    def free(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self.pending.pop(request_id, None)

    def compute(self, requests: Sequence[ScheduledRequest], first_rows: Mapping[str, int], hidden: torch.Tensor,
                compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> PendingPromptLogprobs:
        """Prompt logprobs of this step's chunks of ``requests``; ``hidden`` [T, H], where request r's chunk
        occupies the rows from ``first_rows[r.request_id]`` on. Launched, not waited for."""
        asking = [r for r in requests if r.sampling_params.prompt_logprobs is not None and not r.output_token_ids]
        width = max((r.sampling_params.prompt_logprobs for r in asking), default=0)  # k of every pack
        packs: list[torch.Tensor] = []  # [rows, 2 (1 + width) + 1] on the device
        entries: list[tuple[str, int, int]] = []  # per packed row: (request, prompt position, its k)
        for r in asking:
            k, rid = r.sampling_params.prompt_logprobs, r.request_id
            start, num = r.num_computed_tokens, len(r.token_ids)
            pending = self.pending.pop(rid, None)
            if pending is not None and pending[0] == start:  # the previous chunk's last row predicts token_ids[0]
                target = to_device([r.token_ids[0]], torch.int64, hidden.device)
                packs.append(pack_logprobs(pending[1], width, target, pending[2]))
                entries.append((rid, start, k))
            num_rows = num - 1 if r.sample else num  # rows whose target is a prompt token (or the next chunk's)
            first_row = first_rows[rid]
            for lo in range(0, num_rows, ROWS_PER_PASS):
                hi = min(num_rows, lo + ROWS_PER_PASS)
                logits = compute_logits(hidden[first_row + lo: first_row + hi]).to(torch.float32)  # [hi-lo, V]
                lse = logits.logsumexp(dim=-1, keepdim=True)  # [hi-lo, 1]
                known = min(hi, num - 1) - lo  # rows whose target lies in this chunk
                if known > 0:
                    targets = to_device(r.token_ids[lo + 1: lo + 1 + known], torch.int64, hidden.device)
                    packs.append(pack_logprobs(logits[:known], width, targets, lse[:known]))
                    entries.extend((rid, start + lo + 1 + j, k) for j in range(known))
                if hi == num:  # the chunk's last row: its target comes with the next chunk
                    self.pending[rid] = (start + num, logits[-1:].clone(), lse[-1:].clone())
        packed = to_host(torch.cat(packs) if len(packs) > 1 else packs[0], copies=self._copies()) if packs else None
        return PendingPromptLogprobs([r.request_id for r in asking], entries, packed)

    def _copies(self) -> HostCopies:
        if self.copies is None:
            self.copies = HostCopies(self.max_rows * (2 * MAX_LOGPROBS + 3), torch.float64, self.device)
        return self.copies
