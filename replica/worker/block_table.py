"""The runner's block tables: one row per live request, kept between steps and updated incrementally.

    table[row, j] = id of the request's j-th KV block (0 = the null block: padding)
    num_blocks[row] = how many leading entries of the row are real

The scheduler hands over each request's live ``block_ids`` list, which it only ever extends; it
gives a request a *new* list object when it re-admits it (after preemption). So: the same object as
last time -> copy only the appended ids; another object -> rewrite the row. Requests that decode by
id (persistent batch) get their new blocks through ``extend``. Rows are released with ``free``.
"""

from __future__ import annotations

import numpy as np


class BlockTables:
    def __init__(self, num_rows: int = 256, num_cols: int = 64) -> None:
        self.table = np.zeros((num_rows, num_cols), np.int32)  # [rows, max blocks per request]
        self.num_blocks = np.zeros(num_rows, np.int64)  # [rows] real entries per row
        self.entries: dict[str, list] = {}  # request_id -> [row, block_ids list object last seen]
        self.rows: dict[str, int] = {}  # request_id -> row (for C-speed lookups: map(rows.__getitem__, ids))
        self.free_rows = list(range(num_rows - 1, -1, -1))

    @property
    def num_rows(self) -> int:
        return self.table.shape[0]

    def free(self, request_ids) -> None:
        for rid in request_ids:
            entry = self.entries.pop(rid, None)
            if entry is not None:
                del self.rows[rid]
                row = entry[0]
                self.table[row, : self.num_blocks[row]] = 0
                self.num_blocks[row] = 0
                self.free_rows.append(row)

    def sync(self, request_id: str, ids: list[int]) -> int:
        """Make the request's row equal ``ids`` (its live block table); returns the row."""
        entry = self.entries.get(request_id)
        if entry is None:
            entry = self.entries[request_id] = [self._new_row(), None]
            self.rows[request_id] = entry[0]
        row, known = entry
        written = int(self.num_blocks[row])
        if known is ids and len(ids) == written:
            return row
        self._fit(len(ids))
        if known is not ids or len(ids) < written:  # a new table: rewrite the row
            self.table[row, : len(ids)] = ids
            self.table[row, len(ids): written] = 0
            entry[1] = ids
        else:  # the same table, extended
            self.table[row, written: len(ids)] = ids[written:]
        self.num_blocks[row] = len(ids)
        return row

    def extend(self, request_id: str, new_ids: list[int]) -> None:
        """Append ``new_ids`` to a known request's row (a decode-by-id request gained blocks)."""
        row = self.entries[request_id][0]
        written = int(self.num_blocks[row])
        self._fit(written + len(new_ids))
        self.table[row, written: written + len(new_ids)] = new_ids
        self.num_blocks[row] = written + len(new_ids)
        known = self.entries[request_id][1]
        if known is not None and len(known) != written + len(new_ids):
            self.entries[request_id][1] = None  # not the scheduler's live list (another process): forget it

    def gather(self, reqs, width: int) -> np.ndarray:
        """[len(reqs), width] block tables of ScheduledRequests ``reqs`` (0-padded), synced first."""
        self._fit(width)
        rows = [self.sync(r.request_id, r.block_ids) for r in reqs]
        return self.table[:, :width].take(rows, axis=0)

    def _fit(self, width: int) -> None:
        if width > self.table.shape[1]:
            self.table = np.pad(self.table, ((0, 0), (0, max(width, 2 * self.table.shape[1]) - self.table.shape[1])))

    def _new_row(self) -> int:
        if not self.free_rows:
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self.num_blocks = np.concatenate([self.num_blocks, np.zeros_like(self.num_blocks)])
            self.free_rows = list(range(2 * old - 1, old - 1, -1))
        return self.free_rows.pop()
