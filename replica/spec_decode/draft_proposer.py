"""Drafts of a draft model (``method: "draft_model"``): K tokens decoded by the draft model after the request's
tokens, each sampled from the draft's distribution q (its argmax for a greedy request).

    the draft cache of request r holds K/V of ``state.token_ids`` (its tokens and the drafts fed last time)
    propose:  roll back to the longest prefix shared with r's tokens now (rejected drafts fall off), feed the
              rest in one forward, then each draft but the last one token at a time: K forwards in all, each
              one batch of every request that drafts this step (drafting.py proposes for all of them at once)

Each request keeps blocks of the draft's own cache (worker/draft_model.py, built by the executor's factory); when they
run out, the request used
least recently gives its blocks back and its draft cache is recomputed when it drafts again. The q rows of a
sampled request go to the runner with its drafts (``ScheduledRequest.draft_probs``): rejection.py accepts a
draft with probability min(1, p/q) and resamples from max(0, p - q). A seeded request's draft at output position n
is drawn with a key of its seed and n (sample/draws.py, ``DRAFT_DRAW``): its drafts, like its tokens, do not depend
on what shares its batch; an unseeded request's come from the proposer's generator.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch
from kvmesh.replica.sample.draws import DRAFT_DRAW, purpose_keys, seeded_uniforms
from kvmesh.replica.sample.fixed_sampler import draw_in_order
from kvmesh.replica.spec_decode.rejection import target_probs

if TYPE_CHECKING:
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.spec_decode.config import SpeculativeConfig


@dataclass(slots=True)
class DraftRow:
    """One request's tokens in a draft forward."""

    block_ids: list[int]
    """Its draft block table (covers ``start + len(token_ids)`` positions)."""
    start: int
    """Position of ``token_ids[0]``: the draft cache holds K/V of every earlier position."""
    token_ids: list[int]
    """Tokens fed this forward."""


class DraftModelInterface(Protocol):
    """The draft model and its KV cache (worker/draft_model.py)."""

    device: torch.device
    num_blocks: int
    """Blocks of its cache (block 0 is the null block)."""
    block_size: int

    def forward(self, rows: list[DraftRow]) -> torch.Tensor:
        """The rows' K/V written; logits [len(rows), V] after each row's last token (one-token rows first)."""


class DraftRequest(NamedTuple):
    """A request to draft for."""

    request_id: str
    token_ids: list[int]
    """Its tokens (prompt and output)."""
    max_drafts: int
    """The most drafts it has room for."""
    sp: SamplingParams
    num_output: int = 0
    """Tokens it generated so far: draft j is output position ``num_output + j`` (a seeded request's draw key)."""


@dataclass(slots=True)
class DraftState:
    """One request's part of the draft cache."""

    block_ids: list[int] = field(default_factory=list)
    """Its blocks of the draft cache."""
    token_ids: list[int] = field(default_factory=list)
    """The tokens whose K/V the blocks hold, in order."""


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (list slices compared: C speed)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DraftModelProposer:
    def __init__(self, config: SpeculativeConfig, model: DraftModelInterface, seed: int) -> None:
        self.model, self.k, self.block_size = model, config.num_speculative_tokens, model.block_size
        self.free = list(range(model.num_blocks - 1, 0, -1))
        self.states: OrderedDict[str, DraftState] = OrderedDict()  # least recently drafted first
        self.generator = torch.Generator(model.device).manual_seed(seed)

    def propose(self, items: list[DraftRequest]) -> dict[str, tuple[list[int], torch.Tensor | None]]:
        """request_id -> up to ``min(K, max_drafts)`` drafts continuing its tokens, and their q rows
        [num_drafts, V] (None for a greedy request); a request the draft cache has no room for gets none."""
        live: dict[str, tuple[DraftState, int, DraftRequest]] = {}
        rows: dict[str, DraftRow] = {}
        for item in items:
            request_id, token_ids = item.request_id, item.token_ids
            k = min(self.k, item.max_drafts)
            state = self._rolled_back(request_id, token_ids)
            if k > 0 and self._reserve(state, len(token_ids) + k - 1, live):
                live[request_id] = (state, k, item)
                rows[request_id] = DraftRow(state.block_ids, len(state.token_ids), token_ids[len(state.token_ids):])
        drafts: dict[str, list[int]] = {rid: [] for rid in live}
        probs: dict[str, list[torch.Tensor]] = {rid: [] for rid in live}
        for j in range(self.k):
            # each request's next row: decode rows (one token) first, as the backends order a batch
            order = sorted((rid for rid, (_, k, _) in live.items() if j < k), key=lambda r: len(rows[r].token_ids) > 1)
            if not order:
                break
            logits = self.model.forward([rows[rid] for rid in order])
            for i, rid in enumerate(order):
                state, _, item = live[rid]
                state.token_ids += rows[rid].token_ids
                drafts[rid].append(self._sample(logits[i], item.sp, item.num_output + j, probs[rid]))
                rows[rid] = DraftRow(state.block_ids, len(state.token_ids), [drafts[rid][-1]])
        return {rid: (drafts[rid], torch.stack(probs[rid]) if probs[rid] else None) for rid in live}

    def _sample(self, logits: torch.Tensor, sp: SamplingParams, position: int, probs: list[torch.Tensor]) -> int:
        """The draft at output ``position``: the argmax for a greedy request, else drawn from q (appended to
        ``probs``) with the request's own key when it is seeded."""
        if sp.greedy:
            return int(logits.argmax())
        q = target_probs(logits[None], sp)  # [1, V]
        probs.append(q[0])
        if sp.seed is None:
            u = torch.rand(1, generator=self.generator, device=q.device)
        else:
            u = seeded_uniforms(torch.tensor(purpose_keys(sp.seed, position, 1, DRAFT_DRAW), device=q.device))
        return int(draw_in_order(q, u)[0])

    def release_others(self, request_ids: set[str]) -> None:
        """Give back the blocks of every request not in ``request_ids`` (ended, preempted or waiting)."""
        for request_id in [r for r in self.states if r not in request_ids]:
            self.free += self.states.pop(request_id).block_ids

    def _rolled_back(self, request_id: str, token_ids: list[int]) -> DraftState:
        """The request's state, keeping only the K/V of tokens it still has (at least its last one is fed)."""
        state = self.states.get(request_id)
        if state is None:
            state = self.states[request_id] = DraftState()
        self.states.move_to_end(request_id)
        del state.token_ids[min(common_prefix(state.token_ids, token_ids), len(token_ids) - 1):]
        return state

    def _reserve(self, state: DraftState, num_tokens: int, keep: dict[str, object]) -> bool:
        """Blocks for ``num_tokens`` positions, taken from the least recently drafted requests if need be (never
        from ``keep``'s, the batch's, nor from the request itself: the most recent)."""
        need = -(-num_tokens // self.block_size) - len(state.block_ids)
        while need > len(self.free) and len(self.states) > 1 and (victim := next(iter(self.states))) not in keep:
            self.free += self.states.pop(victim).block_ids
        if need > len(self.free):
            return False
        for _ in range(max(need, 0)):
            state.block_ids.append(self.free.pop())
        return True
