"""A step's inputs: the host arrays the persistent batch's rows give (input_batch.py's module doc has the
arithmetic), and the same inputs as the step reads them on its device."""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from kvmesh.replica.step.scheduler_output import ScheduledRequest
    from kvmesh.replica.worker.block_table import BlockTables

token_ids_of = attrgetter("token_ids")
"""A scheduled request's new token ids."""


class BatchRows(Protocol):
    """What a step's host arrays are read from: the persistent batch's rows (input_batch.py)."""

    block_size: int
    num_computed: np.ndarray
    last_token: np.ndarray
    req_ids: np.ndarray
    block_tables: BlockTables


class StepArrays(NamedTuple):
    """A step's inputs on the host ([T] per token, [n] per request, [N] per sampling request)."""

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    logits_indices: np.ndarray
    """[N] the last token of each request that samples."""
    query_start_loc: np.ndarray
    """[n + 1]."""
    seq_lens: np.ndarray
    block_tables: np.ndarray
    """[n, width] the rows' block ids, 0-padded."""
    sample_rows: np.ndarray
    num_tokens: int


class StepTensors(NamedTuple):
    """The same inputs as the step reads them on its device (None: a graph does not read it)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    logits_indices: torch.Tensor | None
    query_start_loc: torch.Tensor | None
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    gathered: tuple | None = ()
    """The previous step's sampled ids to gather into ``input_ids``: (index, dst) views, when there are."""
    lora_slots: torch.Tensor | None = None
    """The requests' adapter slots (the last array of an eager upload that has them)."""



def step_arrays(batch: BatchRows, rows: np.ndarray, query_lens: np.ndarray, sample_mask: np.ndarray,
                num_decodes: int, prefills: list[ScheduledRequest]) -> StepArrays:
    """The step's inputs on the host, by the module doc's arithmetic over whole arrays (vLLM's
    ``_prepare_inputs``); a row whose block table is short of its tokens is the scheduler's error."""
    n, bs = len(rows), batch.block_size
    num_computed = batch.num_computed[rows]
    if num_decodes == n:
        query_start_loc = np.arange(n + 1)
    else:
        query_start_loc = np.zeros(n + 1, np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    seq_lens = num_computed + query_lens
    num_blocks = batch.block_tables.num_blocks[rows]
    if (seq_lens > num_blocks * bs).any():
        bad = int(np.argmax(seq_lens > num_blocks * bs))
        raise ValueError(f"request {batch.req_ids[rows[bad]]} needs {seq_lens[bad]} token slots but its block "
                         f"table has {num_blocks[bad]} blocks of {bs}; the scheduler must allocate them first")
    if prefills:
        input_ids = np.empty(num_tokens, np.int64)
        input_ids[:num_decodes] = batch.last_token[rows[:num_decodes]]
        input_ids[num_decodes:] = np.fromiter(chain.from_iterable(map(token_ids_of, prefills)), np.int64,
                                              num_tokens - num_decodes)
    else:
        input_ids = batch.last_token[rows]
    if num_tokens == n:  # decode-only step: one token per request
        req_of_token, positions = np.arange(n), num_computed
    else:
        req_of_token = np.repeat(np.arange(n), query_lens)
        positions = np.arange(num_tokens) - np.repeat(query_start_loc[:-1] - num_computed, query_lens)
    block_tables = batch.block_tables.table[rows, : int(num_blocks.max())]  # [n, width], 0-padded
    slot_mapping = block_tables[req_of_token, positions // bs].astype(np.int64) * bs
    slot_mapping += positions % bs
    if num_decodes == n and sample_mask.all():
        logits_indices, sample_rows = np.arange(n), rows
    else:
        logits_indices = query_start_loc[1:][sample_mask] - 1
        sample_rows = rows[sample_mask]
    return StepArrays(input_ids, positions, slot_mapping, logits_indices, query_start_loc, seq_lens, block_tables,
                      sample_rows, num_tokens)

