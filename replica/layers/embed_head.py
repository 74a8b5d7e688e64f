"""Vocabulary-parallel embedding and LM head.

Rank r holds vocabulary rows ``[r * per_rank, (r + 1) * per_rank)`` with
``per_rank = ceil(vocab / tp)``; the last shard is zero-padded past ``vocab_size``.
The embedding zeroes tokens it does not own and all-reduces; the head all-gathers logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kvmesh.replica.distributed.parallel_state import SINGLE, ParallelState
from kvmesh.replica.layers.linear import LoadedWeight, ShardId, loaded_shape, narrow
from torch import nn


class VocabParallelEmbedding(nn.Module):
    """Token id -> hidden vector, with the vocabulary split over ranks."""

    def __init__(self, num_embeddings: int, embedding_dim: int, parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        self.parallel = parallel
        self.num_embeddings = num_embeddings
        self.per_rank = -(-num_embeddings // parallel.tp_size)
        self.vocab_start = parallel.tp_rank * self.per_rank
        self.vocab_end = min(self.vocab_start + self.per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.zeros(self.per_rank, embedding_dim), requires_grad=False)  # [V/tp, H]
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: LoadedWeight, shard_id: ShardId = None) -> None:
        rows = self.vocab_end - self.vocab_start
        if loaded_shape(loaded)[0] != self.num_embeddings:
            raise ValueError(f"checkpoint vocabulary has {loaded_shape(loaded)[0]} rows, model expects "
                             f"{self.num_embeddings}")
        param.data[:rows].copy_(narrow(loaded, 0, self.vocab_start, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.parallel.is_distributed:
            return F.embedding(input_ids, self.weight)
        owned = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        y = F.embedding((input_ids - self.vocab_start) * owned, self.weight)
        y = y * owned.unsqueeze(-1).to(y.dtype)
        return self.parallel.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden -> logits over the whole vocabulary (every rank gets the gathered logits)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)  # [N, V/tp]
        if self.parallel.is_distributed:
            logits = self.parallel.all_gather_last_dim(logits)[:, : self.num_embeddings]
        return logits  # [N, V]
