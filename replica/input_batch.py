"""SchedulerOutput -> the step's input tensors, with numpy (no per-token Python loops).

Requests are reordered decodes-first, longest context first (see attention/metadata.py); all index
arithmetic is done on whole arrays:
    positions[t]   = num_computed_tokens[req(t)] + (t - query_start_loc[req(t)])
    slot_mapping[t] = block_table[req(t), positions[t] // block_size] * block_size + positions[t] % block_size
    logits_indices  = query_start_loc[1:] - 1 for the requests that sample (their last token)
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

import numpy as np
import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.scheduler_output import ScheduledRequest

_token_ids = attrgetter("token_ids")
_block_ids = attrgetter("block_ids")
_num_computed = attrgetter("num_computed_tokens")
_sample = attrgetter("sample")


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
    requests: list[ScheduledRequest] | None = None
    """Every scheduled request, in row order (``common.query_start_loc_cpu[i]`` is request i's first row)."""


class BlockTables:
    """Block tables kept between steps, one row per live request, updated incrementally.

    The scheduler hands over each request's live ``block_ids`` list, which it only ever extends;
    it gives a request a *new* list object when it re-admits it (after preemption). So: the same
    object as last step -> copy only the appended ids; another object -> rewrite the row. Rows are
    released with ``free`` when requests finish.
    """

    def __init__(self, num_rows: int = 256, num_cols: int = 64) -> None:
        self.table = np.zeros((num_rows, num_cols), np.int32)  # [rows, max blocks per request]
        self.entries: dict[str, list] = {}  # request_id -> [row, block_ids list object, ids written]
        self.free_rows = list(range(num_rows - 1, -1, -1))

    def free(self, request_ids) -> None:
        for rid in request_ids:
            entry = self.entries.pop(rid, None)
            if entry is not None:
                self.table[entry[0], : entry[2]] = 0
                self.free_rows.append(entry[0])

    def gather(self, reqs: list[ScheduledRequest], width: int) -> np.ndarray:
        """[len(reqs), width] block tables of ``reqs`` (0-padded)."""
        if width > self.table.shape[1]:
            self.table = np.pad(self.table, ((0, 0), (0, max(width, 2 * self.table.shape[1]) - self.table.shape[1])))
        rows: list[int] = []
        entries = self.entries
        for r in reqs:
            ids = r.block_ids
            entry = entries.get(r.request_id)
            if entry is None or entry[1] is not ids or entry[2] != len(ids):
                entry = self._update(r.request_id, entry, ids)
            rows.append(entry[0])
        table = self.table
        return table[:, :width].take(rows, axis=0)

    def _update(self, request_id: str, entry: list | None, ids: list[int]) -> list:
        if entry is None:
            entry = self.entries[request_id] = [self._new_row(), None, 0]
        row, known, written = entry
        if known is not ids or len(ids) < written:  # a new table: rewrite the row
            self.table[row, : len(ids)] = ids
            self.table[row, len(ids): written] = 0
            entry[1] = ids
        else:  # the same table, extended
            self.table[row, written: len(ids)] = ids[written:]
        entry[2] = len(ids)
        return entry

    def _new_row(self) -> int:
        if not self.free_rows:
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self.free_rows = list(range(2 * old - 1, old - 1, -1))
        return self.free_rows.pop()


def prepare_inputs(scheduled: list[ScheduledRequest], block_size: int, device: torch.device,
                   block_tables_cache: BlockTables | None = None) -> ModelInputs:
    """Build the step's tensors; ``scheduled`` must be non-empty. With ``block_tables_cache`` the
    block tables are updated incrementally (the runner's path); without, built from scratch."""
    # map/attrgetter iterate in C: no Python frame per request
    n = len(scheduled)
    query_lens = np.fromiter(map(len, map(_token_ids, scheduled)), np.int64, n)
    num_computed = np.fromiter(map(_num_computed, scheduled), np.int64, n)
    is_prefill = query_lens != 1
    num_decodes = n - int(is_prefill.sum())
    reqs = scheduled
    if num_decodes:  # decodes first, longest context first (attention groups them by length); prefills stable
        order = np.lexsort((np.where(is_prefill, 0, -num_computed), is_prefill))
        if (order != np.arange(n)).any():
            reqs, query_lens, num_computed = [scheduled[i] for i in order], query_lens[order], num_computed[order]
    num_blocks = np.fromiter(map(len, map(_block_ids, reqs)), np.int64, n)
    query_start_loc = np.zeros(n + 1, np.int64)
    np.cumsum(query_lens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    seq_lens = num_computed + query_lens
    if (seq_lens > num_blocks * block_size).any():
        bad = int(np.argmax(seq_lens > num_blocks * block_size))
        raise ValueError(f"request {reqs[bad].request_id} needs {seq_lens[bad]} token slots but its block table "
                         f"has {num_blocks[bad]} blocks of {block_size}; the scheduler must allocate them first")

    input_ids = np.fromiter(chain.from_iterable(map(_token_ids, reqs)), np.int64, num_tokens)
    if num_tokens == n:  # decode-only step: one token per request
        req_of_token, positions = np.arange(n), num_computed
    else:
        req_of_token = np.repeat(np.arange(n), query_lens)
        positions = np.arange(num_tokens) - np.repeat(query_start_loc[:-1] - num_computed, query_lens)
    if block_tables_cache is not None:
        block_tables = block_tables_cache.gather(reqs, int(num_blocks.max()))
    else:
        block_tables = np.zeros((n, int(num_blocks.max())), np.int32)  # 0 = null block padding
        block_tables[np.arange(block_tables.shape[1])[None, :] < num_blocks[:, None]] = np.fromiter(
            chain.from_iterable(map(_block_ids, reqs)), np.int32, int(num_blocks.sum()))
    slot_mapping = block_tables[req_of_token, positions // block_size].astype(np.int64) * block_size
    slot_mapping += positions % block_size
    sample_mask = np.fromiter(map(_sample, reqs), bool, n)
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
    sample_requests = reqs if sample_mask.all() else [r for r in reqs if r.sample]
    return ModelInputs(dev(input_ids), dev(positions), common, dev(logits_indices), sample_requests, reqs)
