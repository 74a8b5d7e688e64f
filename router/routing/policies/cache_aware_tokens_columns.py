"""``cache_aware_tokens``' walk over the candidates as one numpy pass over their rows of the load columns
(router/routing/cost/load_columns.py), for large fleets: the same arithmetic in the same order, so the same floats and
the same choice (tests/router/test_tokens_policy_columns.py)."""

from __future__ import annotations

import math

import numpy as np
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.policies.cache_aware_tokens_config import CacheAwareTokensConfig
from kvmesh.router.routing.queue_tail import lifted
from kvmesh.router.routing.tier_matches import Matches


def cheapest_rows(c: CacheAwareTokensConfig, block_size: int, prompt: int, matches: Matches,
                  rows_of: CandidateLoads, share: float = 0.0, lift: float = 0.0) -> list[int]:
    """The positions among the candidates (``rows_of.rows``: their rows of the load columns) of the cheapest and of
    those within ``share`` of its uncached tokens of it, in order (``lift``: the queue tail's, ``QueueTail.lift``)."""
    cols, rows = rows_of.columns, rows_of.rows
    cached = np.zeros(len(cols.ids), dtype=np.int64)
    row_of = cols.row
    for rid, blocks in matches.items():
        row = row_of(rid)
        if row is not None:
            cached[row] = blocks
    cost = np.maximum(prompt - block_size * cached[rows], 0).astype(np.float64)  # [k] uncached tokens
    uncached = cost
    backlog, decode = cols.backlog[rows], cols.batch[rows]
    steps = np.maximum((backlog + cost) / c.decode_step_tokens, 1.0)
    recent = cols.recent_prefill[rows]
    total = sum(recent.tolist()) if c.churn_weight else 0.0  # summed as _churn_factor sums, in row order
    evicting = cols.evicting[rows]
    if total > 0:
        working = np.count_nonzero((backlog != 0) | (decode != 0))
        if c.turnover_while_filling:
            busy = 1.0 if c.idle_turnover or working or not any(matches.values()) else 0.0
        else:
            busy = working / len(rows) if c.busy_turnover else 0.0
        g = np.maximum(evicting, busy)
        x = np.clip((len(rows) / total) * recent, 1 / c.churn_clamp, c.churn_clamp)
        cost = np.where((cost != 0) & (g != 0), cost * (1 + c.churn_weight * g * (x - 1)), cost)
    fill, wb = c.filling_backlog_weight, c.backlog_weight
    if fill is not None and fill != wb:
        wb += (fill - wb) * (1 - sum(evicting.tolist()) / len(rows))
    wb = lifted(wb, c.tail_weight, lift)
    cost = cost + (wb * backlog + c.decode_weight * steps * decode)
    release = c.backlog_release_tokens
    if release < math.inf:
        cost = np.where(backlog > release, cost + (1 - wb) * (backlog - release), cost)
    if c.queue_share_weight:  # TokensCost._queue_span and _overflow over these rows
        low, high = float(decode.min()), float(decode.max())
        if high > low:
            term = c.queue_share_weight * prompt / (high - low) * (decode - low)
            if c.queue_share_overflow:
                term = term * np.clip(decode * cols.prompt_per_kv_block[rows] / block_size - 1, 0.0, 1.0)
            cost = cost + term
    first = int(np.argmin(cost))
    best = cost[first]
    return np.flatnonzero(cost <= best + share * uncached[first]).tolist()
