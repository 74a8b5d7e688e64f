"""The token lists of the batch's rows, as the sampler applies them: ``logit_bias``, ``allowed_token_ids`` and the
stop / EOS ids banned until ``min_tokens`` (vLLM v1's logit-bias and min-tokens logits processors, and its
allowed-token mask).

A row's lists become arrays once, when its request joins the batch (``set_row``); the n children of a request
share its lists, and the arrays of the lists read last are remembered, so they are made once for all of them.
Each kind's device tensors change only with what they hold (vLLM's processors update their state from a
BatchUpdate: rows added, removed, moved): the token ids of the rows that carry the kind, in row order, are
uploaded when those rows change (a join, a leave, a row reaching ``min_tokens``); when the rows only move in the
step's order, their step positions are repeated on the device; a step like the last reuses its tensors.

    row r:      bias_ids [B_r] int64, biases [B_r] float32, allowed_ids [A_r] int64, stop_ids [S_r] int64
    members:    r_0 < r_1 < ... the rows of the step that carry a kind; p_j: the step position of r_j
    ids       = ids_0 ++ ids_1 ++ ...                      [T]   uploaded when the members or their lists change
    step rows = repeat_interleave([p_0, p_1, ...], sizes)  [T]   on the device, when a member moves
    banned: stop ids ++ EOS ids (unless ignore_eos) of the rows with num_generated < min_tokens
    allowed: also [p_0, p_1, ...], the rows whose other tokens are -inf
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.utils.cpu_gpu_buffer import to_device

I64, F32 = np.int64, np.float32
_EMPTY = np.zeros(0, I64)

StepTokenLists = tuple[tuple | None, tuple | None, tuple | None]
"""A step's (banned, logit_bias, allowed) tensors, as ``SamplingMetadata`` holds them (None: no row has that kind)."""


@dataclass(slots=True, frozen=True)
class RowTokenLists:
    """One row's token lists as arrays (empty: the row has none of that kind)."""

    bias_ids: np.ndarray
    """[B] int64 the token ids of its logit_bias."""
    biases: np.ndarray
    """[B] float32 their biases."""
    allowed_ids: np.ndarray
    """[A] int64 its allowed_token_ids."""
    stop_ids: np.ndarray
    """[S] int64 its stop_token_ids, banned (with EOS unless it ignores EOS) until it has min_tokens."""
    min_tokens: int
    """Tokens it generates before its stop ids and EOS may be sampled (0: none banned)."""
    ignore_eos: bool
    """EOS is not among the banned ids."""


class RecentArrays:
    """The arrays of the last few lists read, by identity (each list is held while remembered, so that its id
    names it): the n children of a request share their lists, and their arrays are made once."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: OrderedDict[int, tuple[object, int, tuple[np.ndarray, ...]]] = OrderedDict()

    def get(self, values, make: Callable) -> tuple[np.ndarray, ...]:
        hit = self.entries.get(id(values))
        if hit is not None and hit[0] is values and hit[1] == len(values):
            self.entries.move_to_end(id(values))
            return hit[2]
        arrays = make(values)
        self.entries[id(values)] = (values, len(values), arrays)
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return arrays


def _bias_arrays(bias: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    return np.fromiter(bias.keys(), I64, len(bias)), np.fromiter(bias.values(), F32, len(bias))


def _id_array(ids: list[int]) -> tuple[np.ndarray]:
    return (np.fromiter(ids, I64, len(ids)),)


class BatchTokenLists:
    """Every persistent row's token lists, and the tensors of the last step that had each kind of list."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.recent = RecentArrays()
        self.lists: list[RowTokenLists | None] = []
        self.params: list[SamplingParams | None] = []  # what each row's lists were read from
        self.version = np.zeros(0, I64)  # [rows] which lists a row holds: a new number each time they change
        self.has_bias = np.zeros(0, bool)
        self.has_allowed = np.zeros(0, bool)
        self.min_tokens = np.zeros(0, I64)
        self.last_version = 0
        self.built: dict[str, tuple[tuple, tuple | None]] = {}  # kind -> (what it was built from, its tensors)

    @classmethod
    def of(cls, params: Sequence[SamplingParams], device: torch.device) -> BatchTokenLists:
        """Row i holds ``params[i]``'s lists (a batch of its own: tests, benchmarks)."""
        lists = cls(device)
        lists.fit(len(params))
        for row, sp in enumerate(params):
            lists.set_row(row, sp)
        return lists

    def fit(self, num_rows: int) -> None:
        """Hold ``num_rows`` rows (they only grow)."""
        grow = num_rows - len(self.lists)
        if grow > 0:
            self.version, self.has_bias, self.has_allowed, self.min_tokens = (
                np.concatenate([a, np.zeros(grow, a.dtype)])
                for a in (self.version, self.has_bias, self.has_allowed, self.min_tokens))
            self.lists += [None] * grow
            self.params += [None] * grow

    def set_row(self, row: int, sp: SamplingParams) -> None:
        """The row's request is ``sp``'s (a new one, or the same sent again: then nothing changes)."""
        if self.params[row] is sp:
            return
        bias = self.recent.get(sp.logit_bias, _bias_arrays) if sp.logit_bias else (_EMPTY, _EMPTY)
        allowed = self.recent.get(sp.allowed_token_ids, _id_array)[0] if sp.allowed_token_ids else _EMPTY
        stops = self.recent.get(sp.stop_token_ids, _id_array)[0] if sp.min_tokens and sp.stop_token_ids else _EMPTY
        self._set(row, sp, RowTokenLists(bias[0], bias[1], allowed, stops, sp.min_tokens, sp.ignore_eos))

    def clear_row(self, row: int) -> None:
        """The row's request left the batch."""
        self._set(row, None, None)

    def _set(self, row: int, sp: SamplingParams | None, lists: RowTokenLists | None) -> None:
        self.params[row], self.lists[row] = sp, lists
        self.last_version += 1
        self.version[row] = self.last_version
        self.has_bias[row] = lists is not None and len(lists.bias_ids) > 0
        self.has_allowed[row] = lists is not None and len(lists.allowed_ids) > 0
        self.min_tokens[row] = 0 if lists is None else lists.min_tokens

    def step(self, rows: np.ndarray, num_generated: np.ndarray, eos_token_ids: Sequence[int]) -> StepTokenLists:
        """The tensors of the step whose i-th sampling row is ``rows[i]``, which has generated ``num_generated[i]``
        tokens: the last step's where nothing they hold changed."""
        eos = np.asarray(eos_token_ids, I64).reshape(-1)
        banned = self._cached("banned", rows, np.flatnonzero(self.min_tokens[rows] > num_generated),
                              lambda lists: [r.stop_ids if r.ignore_eos else np.concatenate([r.stop_ids, eos])
                                             for r in lists], eos.tobytes())
        bias = self._cached("bias", rows, np.flatnonzero(self.has_bias[rows]),
                            lambda lists: [r.bias_ids for r in lists],
                            values=lambda lists: [r.biases for r in lists])
        allowed = self._cached("allowed", rows, np.flatnonzero(self.has_allowed[rows]),
                               lambda lists: [r.allowed_ids for r in lists])
        if allowed is not None:
            allowed = self._allowing(allowed)
        return banned, bias, allowed

    def _cached(self, kind: str, rows: np.ndarray, positions: np.ndarray, ids_of: Callable, extra: bytes = b"",
                values: Callable | None = None) -> tuple | None:
        """``kind``'s (step rows, token ids[, values]) for the rows at ``positions`` of the step. The ids are kept
        while the same rows hold the same lists (joins and leaves rebuild them), the step rows while they also sit at
        the same positions (a move repeats each row's position on the device: no walk of the lists on the host)."""
        if not len(positions):
            self.built.pop(kind, None)  # nothing holds the last tensors any longer
            return None
        members = rows[positions]
        order = np.argsort(members, kind="stable")  # members by row number: the ids' order whatever the step's
        members, at = members[order], positions[order].astype(I64)
        key = (members.tobytes(), self.version[members].tobytes(), extra)
        built = self.built.get(kind)
        if built is None or built.key != key:
            built = self.built[kind] = self._build(key, [self.lists[r] for r in members.tolist()], ids_of, values)
        if built.total and built.at != at.tobytes():
            row_index = torch.repeat_interleave(to_device(at, torch.int64, self.device), built.sizes,
                                                output_size=built.total)  # [T] each member's position, size times
            built.at, built.step = at.tobytes(), (row_index, *built.ids)
        return built.step

    def _build(self, key: tuple, lists: list[RowTokenLists], ids_of: Callable, values: Callable | None) -> Built:
        ids = ids_of(lists)
        sizes = np.fromiter(map(len, ids), I64, len(ids))
        tensors = [to_device(np.concatenate(ids), torch.int64, self.device)]
        if values is not None:
            tensors.append(to_device(np.concatenate(values(lists)), torch.float32, self.device))
        return Built(key, to_device(sizes, torch.int64, self.device), int(sizes.sum()), tuple(tensors))

    def _allowing(self, step: tuple) -> tuple:
        """(the rows that allow only some tokens [R], then their (rows, token ids)), as the sampler reads them."""
        built = self.built["allowed"]
        if built.allowing is None or built.allowing[0] != built.at:
            positions = np.frombuffer(built.at, I64).copy()
            built.allowing = (built.at, (to_device(positions, torch.int64, self.device), *step))
        return built.allowing[1]


@dataclass(slots=True)
class Built:
    """One kind's tensors: the rows' token ids (and values), and the step's rows of them."""

    key: tuple
    """(the member rows ascending, their lists' versions, anything else they were made from)."""
    sizes: torch.Tensor
    """[R] int64 token ids of each member row, on the device."""
    total: int
    """Their sum (0: none of the rows has an id)."""
    ids: tuple
    """(token ids [T] int64[, values [T] float32]) of the member rows in ascending row order, on the device."""
    at: bytes | None = None
    """The step positions of the member rows that ``step`` was made for."""
    step: tuple | None = None
    """(step rows [T], token ids [T][, values [T]]): what the sampler reads (None: no ids at all)."""
    allowing: tuple | None = None
    """(``at``, the allowed tuple the sampler reads) of the allowed kind."""
