"""``estimate``'s ``choice_s`` for every replica at once, from the loads as columns (router/routing/load_columns.py).

The same arithmetic as estimate.py, term by term and in the same order, on numpy arrays: the results are the
same floats (tests/router/test_pruned_routing.py compares them on randomized fleets), so a decision made from
these equals one made from the per-replica estimates. It covers the candidates that neither pull (a pull's
price is per holder) nor load an adapter; candidates.py prices those few with ``estimate`` itself. A change to
the cost's terms in estimate.py is mirrored here.
"""

from __future__ import annotations

import numpy as np
from kvmesh.router.routing.cost.estimate import MAX_HIT_FRACTION
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.load_columns import LoadColumns


def choice_columns(cols: LoadColumns, fleet: FleetRates, own_tokens: np.ndarray, host_blocks: np.ndarray,
                   block_size: int, step_tokens: float) -> np.ndarray:
    """``choice_s`` per row for a request computing ``own_tokens`` there and loading ``host_blocks`` back
    (no pull, no adapter load; int arrays over rows)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        measured = ~np.isnan(cols.spt)
        prior = fleet.prefill_s_per_token
        spt = np.where(measured, cols.spt, 1.0 if prior is None else prior)  # prefill_s_per_token
        priced = measured if prior is None else np.ones_like(measured)
        backlog, batch = cols.backlog, cols.batch
        context = np.where(cols.context != 0, cols.context,
                           np.where(cols.recent_requests > 0, batch * cols.recent_prompt / cols.recent_requests, 0.0))
        steps = -np.floor_divide(-(backlog + own_tokens), step_tokens) if step_tokens > 0 else np.ones_like(spt)
        step_s = _decode_step_s(cols, fleet, batch, context, spt)
        prefill = own_tokens * spt
        queue = backlog * spt
        interleave = np.where(batch != 0, np.maximum(steps, 1) * step_s, 0.0)
        raw = queue + interleave + prefill
        if host_blocks.any():
            raw = raw + _load_back_s(cols, fleet, host_blocks, block_size, spt)
        ttft = cols.offset + cols.scale * raw  # correction.corrected
        stall = batch * prefill
        hit = np.where(cols.recent_prompt > 0, 1.0 - cols.recent_prefill / cols.recent_prompt, 0.0)
        delay = np.where(priced, cols.arrival * ttft * prefill, 0.0)
        hit = np.minimum(hit, MAX_HIT_FRACTION)
        stored = own_tokens + host_blocks * block_size
        return ttft + stall + delay + hit / (1 - hit) * stored * spt


def _decode_step_s(cols: LoadColumns, fleet: FleetRates, batch: np.ndarray, context: np.ndarray,
                   spt: np.ndarray) -> np.ndarray:
    """estimate.decode_step_s per row."""
    valid, prior = cols.coef_valid, fleet.decode_step
    if prior is None:
        own = cols.coef0 + cols.coef1 * batch + cols.coef2 * context
        seconds = np.where(valid, own, batch * spt)  # no step measured anywhere: a decode row costs a prompt token
    else:
        c0 = np.where(valid, cols.coef0, prior[0])
        c1 = np.where(valid, cols.coef1, prior[1])
        c2 = np.where(valid, cols.coef2, prior[2])
        seconds = c0 + c1 * batch + c2 * context
    return np.where(batch <= 0, 0.0, seconds)


def _load_back_s(cols: LoadColumns, fleet: FleetRates, host_blocks: np.ndarray, block_size: int,
                 spt: np.ndarray) -> np.ndarray:
    """estimate.load_back_s per row."""
    prior_bytes = np.nan if fleet.kv_block_bytes is None else fleet.kv_block_bytes
    nbytes = np.where(cols.block_bytes != 0, cols.block_bytes,
                      np.where(cols.bytes_per_token != 0, cols.bytes_per_token * block_size, prior_bytes))
    prior_rate = np.nan if fleet.h2d_s_per_byte is None else fleet.h2d_s_per_byte
    s_per_byte = np.where(np.isnan(cols.h2d_spb), prior_rate, cols.h2d_spb)
    unknown = np.isnan(nbytes) | np.isnan(s_per_byte)
    seconds = np.where(unknown, host_blocks * block_size * spt, host_blocks * nbytes * s_per_byte)
    return np.where(host_blocks == 0, 0.0, seconds)
