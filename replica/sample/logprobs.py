"""Logprobs on the engine side: the chosen token's log-probability and rank plus the top-k of each row,
from logits and their logsumexp (the full [N, V] log_softmax is never built), copied to the host in one
transfer (non-blocking into the sampler's pinned buffers when it has them; waited for when a row is read).

    values [M, V] (logits, or log-probabilities)  ──gather(chosen) / topk(k)──▶  [M, 1 + k] token ids, values
                                                   (>= count)                ──▶  [M] rank of the chosen token
    logprob = logit - logsumexp(logits of the row)

The sampler (sampled tokens) uses ``gather_logprobs``; prompt_logprobs.py packs each pass of a step with
``pack_logprobs`` and sends them together (``to_host``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from kvmesh.replica.step.outputs import TokenLogprobs

if TYPE_CHECKING:
    from kvmesh.replica.utils.cpu_gpu_buffer import HostCopies


@dataclass(slots=True)
class LogprobsTensors:
    """Per row: the chosen token's logprob and rank, then the top-k (vLLM's ``LogprobsTensors``), packed on
    the host (maybe still arriving: ``event``) as [M, 1 + k token ids | 1 + k logprobs | rank] float64."""

    packed: torch.Tensor
    """[M, 2 (1 + k) + 1] float64 on the host (token ids and ranks < 2**53 are exact)."""
    rows: list[int] | None = None
    """The batch rows these M rows belong to (None: every row, M = N)."""
    event: torch.cuda.Event | None = None
    """The copy to wait for before reading ``packed`` (None: already there)."""
    _lists: tuple | None = field(default=None, repr=False)

    def _host(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        return self.packed

    @property
    def token_ids(self) -> torch.Tensor:
        """[M, 1 + k] int64: the chosen token, then the k most likely in rank order."""
        return self._host()[:, : self._width()].long()

    @property
    def logprobs(self) -> torch.Tensor:
        """[M, 1 + k] float32: their log-probabilities."""
        return self._host()[:, self._width(): 2 * self._width()].float()

    @property
    def ranks(self) -> torch.Tensor:
        """[M] int64: rank of the chosen token (1 = most likely; tied tokens count, as vLLM's >= count)."""
        return self._host()[:, -1].long()

    def _width(self) -> int:
        return (self.packed.shape[1] - 1) // 2

    def row(self, i: int, num_logprobs: int) -> TokenLogprobs:
        """Batch row ``i`` cut to the chosen token plus its request's ``num_logprobs`` most likely."""
        if self._lists is None:  # one tolist for all rows
            index = None if self.rows is None else {row: j for j, row in enumerate(self.rows)}
            self._lists = (self.token_ids.tolist(), self.logprobs.tolist(), self.ranks.tolist(), index)
        token_ids, logprobs, ranks, index = self._lists
        j = i if index is None else index[i]
        return TokenLogprobs(token_ids[j][: 1 + num_logprobs], logprobs[j][: 1 + num_logprobs], ranks[j])


def pack_logprobs(values: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
                  lse: torch.Tensor | None = None) -> torch.Tensor:
    """The chosen ``token_ids`` [M] and the ``num_logprobs`` most likely tokens of each row of ``values``:
    log-probabilities [M, V], or logits with their ``lse`` [M, 1] (logprob = logit - logsumexp), packed on
    the device as [M, 1 + k token ids | 1 + k logprobs | rank] float64 (``LogprobsTensors.packed``)."""
    chosen = token_ids.to(torch.int64).unsqueeze(1)  # [M, 1]
    chosen_values = values.gather(1, chosen)  # [M, 1]
    if values.device.type == "cpu":  # numpy's comparison is ~3x faster than torch's CPU kernel here
        ranks = torch.from_numpy((values.numpy() >= chosen_values.numpy()).sum(axis=-1))  # [M]
    else:
        ranks = (values >= chosen_values).sum(dim=-1)
    token_ids_out, values_out = chosen, chosen_values
    if num_logprobs > 0:
        top = values.topk(num_logprobs, dim=-1)  # values/indices [M, k], descending
        token_ids_out = torch.cat([chosen, top.indices], dim=1)
        values_out = torch.cat([chosen_values, top.values], dim=1)
    if lse is not None:
        values_out = values_out - lse
    # token ids and ranks < 2**53 are exact in float64
    return torch.cat([token_ids_out.double(), values_out.double(), ranks.double().unsqueeze(1)], dim=1)


def to_host(packed: torch.Tensor, rows: list[int] | None = None, copies: HostCopies | None = None) -> LogprobsTensors:
    """Packed logprobs [M, W] on their way to the host in one transfer: enqueued without waiting into
    ``copies`` (read through ``LogprobsTensors``, which waits for it), or blocking without."""
    if copies is None:
        return LogprobsTensors(packed.cpu(), rows)
    host, event = copies.start(packed)
    return LogprobsTensors(host, rows, event)


def gather_logprobs(values: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
                    lse: torch.Tensor | None = None, rows: list[int] | None = None,
                    copies: HostCopies | None = None) -> LogprobsTensors:
    """``pack_logprobs`` of the rows, sent to the host by ``to_host`` (non-blocking with ``copies``)."""
    return to_host(pack_logprobs(values, num_logprobs, token_ids, lse), rows, copies)
