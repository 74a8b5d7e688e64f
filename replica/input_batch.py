"""SchedulerOutput -> the step's input tensors, with numpy (no per-token Python loops).

Requests are reordered decodes-first (see attention/metadata.py); all index arithmetic is done on
whole arrays:
    positions[t]   = num_computed_tokens[req(t)] + (t - query_start_loc[req(t)])
    slot_mapping[t] = block_table[req(t), positions[t] // block_size] * block_size + positions[t] % block_size
    logits_indices  = query_start_loc[1:] - 1 for the requests that sample (their last token)
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.scheduler_output import ScheduledRequest


@dataclass(slots=True)
class ModelInputs:
    input_ids: torch.Tensor
    """[T] int64."""
    positions: torch.Tensor
    """[T] int64."""
    common: CommonAttentionMetadata
    """Attention description of the step."""
    logits_indices: torch.Tensor
    """[N] int64 rows of the hidden states whose logits are sampled."""
    sample_requests: list[ScheduledRequest]
    """The N requests that sample, in row order."""


def prepare_inputs(scheduled: list[ScheduledRequest], block_size: int, device: torch.device) -> ModelInputs:
    """Build the step's tensors; ``scheduled`` must be non-empty."""
    reqs = sorted(scheduled, key=lambda r: len(r.token_ids) != 1)  # stable: decodes first
    n = len(reqs)
    num_decodes = sum(1 for r in reqs if len(r.token_ids) == 1)
    query_lens = np.fromiter((len(r.token_ids) for r in reqs), np.int64, n)
    num_computed = np.fromiter((r.num_computed_tokens for r in reqs), np.int64, n)
    num_blocks = np.fromiter((len(r.block_ids) for r in reqs), np.int64, n)
    query_start_loc = np.zeros(n + 1, np.int64)
    np.cumsum(query_lens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    seq_lens = num_computed + query_lens
    if (seq_lens > num_blocks * block_size).any():
        bad = int(np.argmax(seq_lens > num_blocks * block_size))
        raise ValueError(f"request {reqs[bad].request_id} needs {seq_lens[bad]} token slots but its block table "
                         f"has {num_blocks[bad]} blocks of {block_size}; the scheduler must allocate them first")

    input_ids = np.fromiter(chain.from_iterable(r.token_ids for r in reqs), np.int64, num_tokens)
    req_of_token = np.repeat(np.arange(n), query_lens)
    positions = np.arange(num_tokens) - np.repeat(query_start_loc[:-1] - num_computed, query_lens)
    block_tables = np.zeros((n, int(num_blocks.max())), np.int32)  # 0 = null block padding
    block_tables[np.arange(block_tables.shape[1])[None, :] < num_blocks[:, None]] = np.fromiter(
        chain.from_iterable(r.block_ids for r in reqs), np.int32, int(num_blocks.sum()))
    slot_mapping = block_tables[req_of_token, positions // block_size].astype(np.int64) * block_size
    slot_mapping += positions % block_size
    sample_mask = np.fromiter((r.sample for r in reqs), bool, n)
    logits_indices = query_start_loc[1:][sample_mask] - 1

    def dev(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t if device.type == "cpu" else t.to(device, non_blocking=True)

    common = CommonAttentionMetadata(
        num_reqs=n, num_decodes=num_decodes, num_actual_tokens=num_tokens,
        max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()), block_size=block_size,
        query_start_loc=dev(query_start_loc.astype(np.int32)), seq_lens=dev(seq_lens.astype(np.int32)),
        block_tables=dev(block_tables), slot_mapping=dev(slot_mapping),
        query_start_loc_cpu=query_start_loc.tolist(), seq_lens_cpu=seq_lens.tolist(),
    )
    return ModelInputs(dev(input_ids), dev(positions), common, dev(logits_indices),
                       [r for r in reqs if r.sample])
