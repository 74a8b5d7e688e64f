"""What attention needs to know about one step's batch (built once per step, passed to every layer).

The runner orders a step's requests decodes-first:

    tokens:  [ d0 d1 ... d(D-1) | p0 p0 p0 p0 | p1 p1 ... ]     D decode rows (1 token each),
              <- num_decodes -> <- prefill chunks, one run of query tokens per request ->

Request i computes positions [seq_lens[i] - query_lens[i], seq_lens[i]); its K/V for every position
< seq_lens[i] is (after this step's write) in the cache at slot
``block_tables[i, pos // block_size] * block_size + pos % block_size``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class CommonAttentionMetadata:
    """Backend-independent description of a step."""

    num_reqs: int
    """Requests in the step."""
    num_decodes: int
    """Leading requests with exactly one query token (decode rows)."""
    num_actual_tokens: int
    """Tokens in the step (sum of query_lens)."""
    max_query_len: int
    """Longest query run."""
    max_seq_len: int
    """Longest context + query."""
    block_size: int
    """Tokens per KV block."""
    query_start_loc: torch.Tensor
    """[num_reqs + 1] int32 on device: cumulative query lengths (cu_seqlens_q)."""
    seq_lens: torch.Tensor
    """[num_reqs] int32 on device: context + query length per request."""
    block_tables: torch.Tensor
    """[num_reqs, max_blocks] int32 on device, padded with 0 (the null block)."""
    slot_mapping: torch.Tensor
    """[num_actual_tokens] int64 on device: cache slot of every token."""
    query_start_loc_cpu: list[int]
    """Host copy of query_start_loc."""
    seq_lens_cpu: list[int]
    """Host copy of seq_lens."""
    block_tables_cpu: np.ndarray | None = None
    """Host copy of block_tables (None: backends copy it back when they need it)."""
